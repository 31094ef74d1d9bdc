//! The keys a run parked in doubt, as an operator names them: the key as the agent
//! sees it (`order-17/charge`) or as the store keeps it, in the run's namespace
//! (`billing:order-17/charge`).

use super::{Store, StoreError};

/// The store's name for an agent's `key` in `namespace`: the namespace, a colon, the
/// key. Namespaces hold no colon, so the first colon splits the two.
pub fn qualified_key(namespace: &str, key: &str) -> String {
    format!("{namespace}:{key}")
}

/// The keys one run has parked in doubt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedKeys {
    /// The run.
    pub run_id: String,
    /// The namespace its keys live in.
    pub namespace: String,
    /// Its parked keys, as the store keeps them (qualified).
    pub keys: Vec<String>,
}

/// Which parked key an operator's text names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkedMatch<'a> {
    /// This one (as the store keeps it).
    One(&'a str),
    /// Two: the text is an agent's key that looks like a qualified one
    /// (`ns:x`, stored as `ns:ns:x`) while `x` is parked too (stored as `ns:x`).
    Both(&'a str, &'a str),
    /// None of the run's parked keys.
    None,
}

impl ParkedKeys {
    /// The parked keys of run `run_id`; `None` if there is no such run.
    pub async fn of(store: &dyn Store, run_id: &str) -> Result<Option<ParkedKeys>, StoreError> {
        let Some(run) = store.run(run_id).await? else {
            return Ok(None);
        };
        let keys = store
            .open_claims(Some(run_id))
            .await?
            .into_iter()
            .filter(|c| c.parked.is_some())
            .map(|c| c.key)
            .collect();
        Ok(Some(ParkedKeys {
            run_id: run.run_id,
            namespace: run.namespace,
            keys,
        }))
    }

    /// The parked key that `key` names, taken as the agent's key or as the stored one.
    ///
    /// ```
    /// use idem::store::{ParkedKeys, ParkedMatch};
    ///
    /// let parked = ParkedKeys {
    ///     run_id: "wire".into(),
    ///     namespace: "billing".into(),
    ///     keys: vec!["billing:order-17/charge".into()],
    /// };
    /// let found = ParkedMatch::One("billing:order-17/charge");
    /// assert_eq!(parked.find("order-17/charge"), found);
    /// assert_eq!(parked.find("billing:order-17/charge"), found);
    /// assert_eq!(parked.find("order-18/charge"), ParkedMatch::None);
    /// ```
    pub fn find(&self, key: &str) -> ParkedMatch<'_> {
        let as_agent = qualified_key(&self.namespace, key);
        let parked = |name: &str| self.keys.iter().find(|k| *k == name).map(String::as_str);
        match (parked(&as_agent), parked(key)) {
            (Some(a), Some(b)) => ParkedMatch::Both(a, b),
            (Some(one), _) | (None, Some(one)) => ParkedMatch::One(one),
            (None, None) => ParkedMatch::None,
        }
    }

    /// The key as the agent sees it: `stored` without the run's namespace.
    pub fn agent_key<'a>(&self, stored: &'a str) -> &'a str {
        stored
            .strip_prefix(self.namespace.as_str())
            .and_then(|rest| rest.strip_prefix(':'))
            .unwrap_or(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(keys: &[&str]) -> ParkedKeys {
        ParkedKeys {
            run_id: "r".into(),
            namespace: "ns".into(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn an_agent_key_that_looks_qualified_is_told_apart() {
        let p = parked(&["ns:x", "ns:ns:x"]);
        assert_eq!(p.find("x"), ParkedMatch::One("ns:x"));
        assert_eq!(p.find("ns:x"), ParkedMatch::Both("ns:ns:x", "ns:x"));
        assert_eq!(p.find("ns:ns:x"), ParkedMatch::One("ns:ns:x"));
        assert_eq!(p.agent_key("ns:ns:x"), "ns:x");
        assert_eq!(p.agent_key("other:x"), "other:x");
        assert_eq!(parked(&[]).find("x"), ParkedMatch::None);
    }
}
