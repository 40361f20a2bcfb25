//! A runbook parameter's value, shared by the manifests that declare it
//! (the engine) and the run summaries that record it (the audit log).

use serde::{Deserialize, Serialize};

/// A typed parameter value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    String(String),
}
