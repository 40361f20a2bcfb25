//! The fleet inventory (`fleet.yaml`): every node's address, pinned host
//! key and labels.
//!
//! ```yaml
//! version: 1
//! defaults: { user: nightshift, port: 2222 }
//! nodes:
//!   - name: gpu-a1
//!     address: 10.0.0.11
//!     host_key: SHA256:1g6d…
//!     labels: { pool: a, rack: r1, nvlink_domain: a1, gpu_model: h100-sxm }
//!     standby: false
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::runbooks::manifest::{LoadError, locate};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    pub version: u32,
    #[serde(default)]
    pub defaults: NodeDefaults,
    pub nodes: Vec<NodeSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDefaults {
    #[serde(default = "default_user")]
    pub user: String,
    #[serde(default = "default_port")]
    pub port: u16,
}

fn default_user() -> String {
    "nightshift".into()
}
fn default_port() -> u16 {
    2222
}

impl Default for NodeDefaults {
    fn default() -> Self {
        NodeDefaults { user: default_user(), port: default_port() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    /// Host or `host:port`.
    pub address: String,
    /// The agent's host key fingerprint, `SHA256:…` (`nightshift-agent fingerprint`).
    pub host_key: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A spare node kept drained until capacity is needed (scale-out).
    #[serde(default)]
    pub standby: bool,
    /// The scheduler powers this node down while it is idle (Slurm power
    /// saving): scale-out powers it up through a peer of its group
    /// (`scontrol update State=POWER_UP`, which runs the site's
    /// `ResumeProgram`), scale-in powers down what it powered up.
    #[serde(default)]
    pub power_saving: bool,
}

impl NodeSpec {
    /// `host:port`, filling in the default port.
    pub fn addr(&self, defaults: &NodeDefaults) -> String {
        if self.address.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
            self.address.clone()
        } else {
            format!("{}:{}", self.address, defaults.port)
        }
    }
}

impl Inventory {
    /// Read and validate.
    pub fn load(path: &Path) -> Result<Inventory, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError {
            file: path.into(),
            line: 0,
            column: 0,
            message: format!("cannot read the inventory: {e}"),
        })?;
        Inventory::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Inventory, LoadError> {
        let inv: Inventory = nightshift_proto::yaml::from_str(text).map_err(|e| {
            let (line, column, message) = nightshift_proto::yaml::error_parts(&e);
            LoadError { file: path.into(), line, column, message }
        })?;
        let err = |needle: &str, message: String| {
            let (line, column) = locate(text, needle);
            LoadError { file: PathBuf::from(path), line, column, message }
        };
        if inv.version != 1 {
            return Err(err("version", format!("unsupported inventory version: expected 1, found {}", inv.version)));
        }
        let mut seen = std::collections::HashSet::new();
        // Two entries that reach one agent (one address, or one host key)
        // would make a release on one node change the other, audited
        // under the wrong name.
        let mut addrs: std::collections::HashMap<String, &str> = Default::default();
        let mut keys: std::collections::HashMap<&str, &str> = Default::default();
        for (i, n) in inv.nodes.iter().enumerate() {
            let addr = n.addr(&inv.defaults);
            if let Some(first) = addrs.insert(addr.clone(), &n.name) {
                return Err(err(
                    &format!("nodes.{i}.address"),
                    format!(
                        "nodes.{i}: expected each node at its own address, found `{}` at {addr}, the address of `{first}`: \
                         both entries would reach one agent",
                        n.name
                    ),
                ));
            }
            if let Some(first) = keys.insert(&n.host_key, &n.name) {
                return Err(err(
                    &format!("nodes.{i}.host_key"),
                    format!(
                        "nodes.{i}: expected each node's own host key, found `{}` with the host key of `{first}` ({}): one \
                         agent answering as both, or a cloned key (regenerate it on the clone: nightshift-agent keygen --force)",
                        n.name, n.host_key
                    ),
                ));
            }
        }
        for n in &inv.nodes {
            if n.name.is_empty() || n.name.contains(char::is_whitespace) {
                return Err(err("name", format!("node name must be non-empty without spaces, found {:?}", n.name)));
            }
            if !seen.insert(n.name.clone()) {
                return Err(err(&n.name, format!("node `{}` is listed twice", n.name)));
            }
            if !n.host_key.starts_with("SHA256:") {
                return Err(err(
                    &n.host_key,
                    format!(
                        "nodes.{}.host_key: expected a SHA256 fingerprint (run `nightshift-agent fingerprint` on the node), found {:?}",
                        n.name, n.host_key
                    ),
                ));
            }
        }
        Ok(inv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        let ok =
            "version: 1\nnodes:\n  - name: a\n    address: 10.0.0.1\n    host_key: SHA256:abc\n    labels: {pool: p}\n";
        let inv = Inventory::parse(ok, Path::new("fleet.yaml")).unwrap();
        assert_eq!(inv.nodes[0].addr(&inv.defaults), "10.0.0.1:2222");
        let bad = "version: 1\nnodes:\n  - name: a\n    address: x:22\n    host_key: abc\n";
        let e = Inventory::parse(bad, Path::new("fleet.yaml")).unwrap_err();
        assert_eq!(e.line, 5);
        assert!(e.message.contains("expected a SHA256 fingerprint"));
        let dup = "version: 1\nnodes:\n  - {name: a, address: x, host_key: 'SHA256:1'}\n  - {name: a, address: y, host_key: 'SHA256:2'}\n";
        assert!(Inventory::parse(dup, Path::new("f")).unwrap_err().message.contains("listed twice"));
        // Issue 46 point 8: one address or one host key for two nodes;
        // a label given twice.
        let one_addr = "version: 1\nnodes:\n  - {name: a, address: x, host_key: 'SHA256:1'}\n  - {name: b, address: 'x:2222', host_key: 'SHA256:2'}\n";
        let e = Inventory::parse(one_addr, Path::new("f")).unwrap_err();
        assert_eq!(
            (e.line, e.message.as_str()),
            (
                4,
                "nodes.1: expected each node at its own address, found `b` at x:2222, the address of `a`: both entries would reach one agent"
            )
        );
        let one_key = "version: 1\nnodes:\n  - {name: a, address: x, host_key: 'SHA256:1'}\n  - {name: b, address: y, host_key: 'SHA256:1'}\n";
        let e = Inventory::parse(one_key, Path::new("f")).unwrap_err();
        assert!(
            e.message.starts_with("nodes.1: expected each node's own host key, found `b` with the host key of `a`"),
            "{e}"
        );
        let label_twice = "version: 1\nnodes:\n  - name: a\n    address: x\n    host_key: 'SHA256:1'\n    labels: {pool: p, pool: q}\n";
        let e = Inventory::parse(label_twice, Path::new("f")).unwrap_err();
        assert!(e.message.contains("duplicate entry with key \"pool\""), "{e}");
        let unknown = "version: 1\nnodes:\n  - {name: a, adress: x, host_key: 'SHA256:1'}\n";
        let e = Inventory::parse(unknown, Path::new("f")).unwrap_err();
        assert!(e.to_string().starts_with("f:3:"), "{e}");
        assert!(e.message.contains("unknown field `adress`"));
    }
}
