//! The `Agent` trait and the glue that turns it into the component's `run` export.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;

/// An agent: typed input in, typed output out, side effects through
/// [`run_once`](crate::run_once).
///
/// The host may drop the instance at any host call and call `run` again, with the same
/// input, on a fresh instance: `run` must get back to where it was from its
/// [checkpoint](crate::load) and its keys, never from memory. Export it with
/// [`export_agent!`](crate::export_agent).
///
/// ```
/// use idem_sdk::{Agent, Error};
///
/// struct Shout;
///
/// impl Agent for Shout {
///     type Input = String;
///     type Output = String;
///
///     fn run(input: String) -> Result<String, Error> {
///         Ok(input.to_uppercase())
///     }
/// }
///
/// idem_sdk::export_agent!(Shout);
/// # fn main() {}
/// ```
pub trait Agent {
    /// The run's input, decoded from the JSON the host was given.
    type Input: DeserializeOwned;
    /// The run's output, encoded to JSON for the host.
    type Output: Serialize;

    /// Runs (or resumes) the agent. An `Err` fails the run with its `Display` text.
    fn run(input: Self::Input) -> Result<Self::Output, Error>;
}

/// Makes `$agent` (a type implementing [`Agent`]) the component's `run` export: the
/// input bytes are decoded as JSON into `Input`, and `Output` encoded back as JSON; any
/// [`Error`] becomes the export's `err` with its `Display` text.
///
/// Call it once, at the root of the agent's `cdylib` crate.
///
/// ```
/// struct Echo;
///
/// impl idem_sdk::Agent for Echo {
///     type Input = serde_json::Value;
///     type Output = serde_json::Value;
///
///     fn run(input: serde_json::Value) -> Result<serde_json::Value, idem_sdk::Error> {
///         Ok(input)
///     }
/// }
///
/// idem_sdk::export_agent!(Echo);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! export_agent {
    ($agent:ty) => {
        const _: () = {
            struct IdemAgentExport;

            impl $crate::bindings::Guest for IdemAgentExport {
                fn run(
                    input: ::std::vec::Vec<u8>,
                ) -> ::core::result::Result<::std::vec::Vec<u8>, ::std::string::String> {
                    $crate::__private::run::<$agent>(&input)
                }
            }

            $crate::bindings::__export_agent_world!(
                IdemAgentExport with_types_in $crate::bindings
            );
        };
    };
}

/// The body of the `run` export, kept out of the macro so agents compile less code.
#[doc(hidden)]
pub fn run<A: Agent>(input: &[u8]) -> Result<Vec<u8>, String> {
    let input =
        serde_json::from_slice(input).map_err(|err| Error::codec("input", err).to_string())?;
    let output = A::run(input).map_err(|err| err.to_string())?;
    serde_json::to_vec(&output).map_err(|err| Error::codec("output", err).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Sum;

    impl Agent for Sum {
        type Input = Vec<u64>;
        type Output = u64;

        fn run(input: Vec<u64>) -> Result<u64, Error> {
            if input.is_empty() {
                Err("nothing to sum")?;
            }
            Ok(input.iter().sum())
        }
    }

    #[test]
    fn json_in_json_out() {
        assert_eq!(run::<Sum>(b"[1,2,3]"), Ok(b"6".to_vec()));
    }

    #[test]
    fn agent_errors_become_their_text() {
        assert_eq!(run::<Sum>(b"[]"), Err("nothing to sum".to_owned()));
    }

    #[test]
    fn bad_input_names_the_input() {
        let Err(text) = run::<Sum>(b"{") else {
            panic!("malformed input was accepted");
        };
        assert!(text.starts_with("JSON: input: "), "{text}");
    }
}
