//! A price table: what a million tokens of each kind cost per model, which turns usage
//! totals into cost where they are shown (`idem show`, `idem usage`, the API, the web
//! page and `/metrics` of `idem serve --prices`).
//!
//! The table is JSON, one entry per model as the agent names it:
//!
//! ```json
//! {"gpt-4o-mini": {"input": 0.15, "output": 0.60, "cached": -0.075},
//!  "claude-sonnet-4": {"input": 3.0, "output": 15.0, "cached": 0.30}}
//! ```
//!
//! A call costs `input × input + output × output + cached × cached`, per million
//! tokens, in whatever currency the table is written in. `cached` is what a cached
//! token costs *on top of* its count among the input tokens: providers count them
//! differently (OpenAI's prompt tokens include the cached ones, so its `cached` is the
//! discount, negative; Anthropic's input tokens leave cache reads out, so its `cached`
//! is the cache-read price). A model the table does not name has no cost.

use std::collections::BTreeMap;
use std::path::Path;

use crate::store::{Tokens, UsageTotal};
use crate::text;

/// Prices of one model, per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Per million input (prompt) tokens.
    pub input: f64,
    /// Per million output (generated) tokens.
    pub output: f64,
    /// Per million cached tokens, on top of their count among the input tokens.
    #[serde(default)]
    pub cached: f64,
}

/// Why a price table was refused: names the bad entry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PriceError {
    /// The file could not be read.
    #[error("cannot read the price table {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The table is not a JSON object of models.
    #[error("the price table is not a JSON object of models: {0}")]
    NotATable(String),
    /// One model's entry is wrong.
    #[error("the price table's entry for model {model}: {reason}")]
    Entry {
        /// The model, quoted.
        model: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Prices by model.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Prices {
    by_model: BTreeMap<String, Price>,
}

impl Prices {
    /// Reads a table from `path`.
    pub fn load(path: &Path) -> Result<Prices, PriceError> {
        let text = std::fs::read_to_string(path).map_err(|source| PriceError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Prices::parse(&text)
    }

    /// Parses a table: every entry a model with finite, non-negative `input` and
    /// `output` prices, and a `cached` price that leaves a cached token's price
    /// (`input + cached`) non-negative.
    pub fn parse(text: &str) -> Result<Prices, PriceError> {
        let table: BTreeMap<String, serde_json::Value> =
            serde_json::from_str(text).map_err(|e| PriceError::NotATable(e.to_string()))?;
        let mut by_model = BTreeMap::new();
        for (model, entry) in table {
            let bad = |reason: String| PriceError::Entry {
                model: text::quoted(&model),
                reason,
            };
            if model.is_empty() {
                return Err(bad("the model name is empty".into()));
            }
            let price: Price = serde_json::from_value(entry).map_err(|e| bad(e.to_string()))?;
            for (kind, value) in [
                ("input", price.input),
                ("output", price.output),
                ("cached", price.cached),
            ] {
                if !value.is_finite() {
                    return Err(bad(format!("the {kind} price is not a finite number")));
                }
            }
            if price.input < 0.0 || price.output < 0.0 {
                return Err(bad("a price of input or output tokens is negative".into()));
            }
            if price.input + price.cached < 0.0 {
                return Err(bad(format!(
                    "a cached token would cost {} (input {} plus cached {}): less than nothing",
                    price.input + price.cached,
                    price.input,
                    price.cached
                )));
            }
            by_model.insert(model, price);
        }
        Ok(Prices { by_model })
    }

    /// The price of `model`, if the table names it.
    pub fn price(&self, model: &str) -> Option<&Price> {
        self.by_model.get(model)
    }

    /// What `tokens` of `model` cost, if the table prices the model.
    pub fn cost(&self, model: &str, tokens: Tokens) -> Option<f64> {
        let price = self.price(model)?;
        // Counts are at most 2^53 per kind in any real store: exact as f64.
        let per_million = tokens.input as f64 * price.input
            + tokens.output as f64 * price.output
            + tokens.cached as f64 * price.cached;
        Some(per_million / 1_000_000.0)
    }
}

/// A usage total with its cost, where the price table names its model.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PricedUsage {
    /// The total.
    #[serde(flatten)]
    pub total: UsageTotal,
    /// What the spent tokens cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spent_cost: Option<f64>,
    /// What the replays would have cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_cost: Option<f64>,
}

impl PricedUsage {
    /// `totals`, each priced by `prices` if given.
    pub fn of(totals: Vec<UsageTotal>, prices: Option<&Prices>) -> Vec<PricedUsage> {
        totals
            .into_iter()
            .map(|total| {
                let cost = |tokens| prices.and_then(|p| p.cost(&total.model, tokens));
                PricedUsage {
                    spent_cost: cost(total.spent),
                    saved_cost: cost(total.saved),
                    total,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_prices_each_kind_per_million_tokens() {
        let prices =
            Prices::parse(r#"{"gpt": {"input": 2.0, "output": 8.0, "cached": -1.0}}"#).unwrap();
        let tokens = Tokens {
            input: 1_000_000,
            output: 500_000,
            cached: 200_000,
        };
        let cost = prices.cost("gpt", tokens).unwrap();
        assert!((cost - 5.8).abs() < 1e-9, "{cost}");
        assert_eq!(prices.cost("other", tokens), None);
    }

    #[test]
    fn a_bad_entry_is_named() {
        for (table, says) in [
            ("[1, 2]", "not a JSON object"),
            (r#"{"gpt": {"input": 1}}"#, "missing field `output`"),
            (r#"{"gpt": {"input": -1, "output": 1}}"#, "negative"),
            (
                r#"{"gpt": {"input": 1, "output": 1, "cahced": 1}}"#,
                "unknown field",
            ),
            (
                r#"{"gpt": {"input": 1, "output": 1, "cached": -2}}"#,
                "less than nothing",
            ),
            (r#"{"gpt": {"input": "1", "output": 1}}"#, "invalid type"),
            (r#"{"": {"input": 1, "output": 1}}"#, "empty"),
        ] {
            let err = Prices::parse(table).unwrap_err().to_string();
            assert!(err.contains(says), "{table}: {err}");
            if table.contains("gpt") {
                assert!(err.contains("\"gpt\""), "{table}: {err} names the model");
            }
        }
    }
}
