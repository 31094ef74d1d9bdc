//! Deployments: a name pointing at a component, and how a component joins a namespace.

use super::Millis;
#[cfg(doc)]
use super::{CatalogStore, StoreError};

/// A component deployed under a name: [`CatalogStore::deploy`].
#[derive(Debug, Clone)]
pub struct Deployment<'a> {
    /// The name (which is also the namespace its runs' keys live in by default).
    pub name: &'a str,
    /// The component's digest; the component must be in the store.
    pub digest: &'a str,
    /// The most the deployment's runs may reach, as the runtime encodes it.
    pub authority: &'a [u8],
    /// How the component joins the name's namespace.
    pub admission: Admission,
    /// Where the component was loaded from when a person ran a local file (`idem
    /// run`): the file on this machine. A first-use deployment from the source of the
    /// name's current first-use deployment joins as [`Admission::Rebuild`]. `None` for
    /// an operator's deployment, which no rebuild follows implicitly.
    pub source: Option<&'a str>,
}

/// How a component joins a namespace that other components may already use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Admission {
    /// An operator's explicit act (`deploy`, or an upgrade): the component joins the
    /// namespace whoever else is in it.
    Explicit,
    /// Implied by running a component under a name: it joins only a namespace nobody
    /// uses yet, or one it is already in; otherwise [`StoreError::NamespaceTaken`] —
    /// unless it is a rebuild.
    FirstUse,
    /// A first use that joined a namespace other components use because it came from
    /// the same [`Deployment::source`] as the name's current deployment, itself a first
    /// use or a rebuild: a new build of the file a person runs while developing. Never
    /// asked for; the store records it in place of `FirstUse`.
    Rebuild,
}

impl Admission {
    /// The name the store keeps.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Admission::Explicit => "explicit",
            Admission::FirstUse => "first-use",
            Admission::Rebuild => "rebuild",
        }
    }

    /// The admission a store keeps under `name`, if it is one.
    pub(crate) fn from_name(name: &str) -> Option<Admission> {
        [Admission::Explicit, Admission::FirstUse, Admission::Rebuild]
            .into_iter()
            .find(|a| a.as_str() == name)
    }
}

/// A deployment as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeploymentRecord {
    /// The name.
    pub name: String,
    /// The component it points at.
    pub digest: String,
    /// The authority it grants, encoded.
    #[serde(skip)]
    pub authority: Vec<u8>,
    /// When it was deployed.
    pub deployed_at: Millis,
    /// How its component joined the namespace.
    pub admission: Admission,
    /// The local file it was run from, for a deployment made by running one.
    pub source: Option<String>,
}
