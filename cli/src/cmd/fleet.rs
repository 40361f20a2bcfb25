//! `nightshift fleet mode`: show or set the whole fleet's mode (act, shadow,
//! paused). `nightshift fleet import`: build `fleet.yaml` from the scheduler's node
//! list (`scontrol --oneliner show nodes`, piped in: the CLI spawns no
//! process) or an Ansible-style INI inventory, collecting each agent's host
//! key over SSH.
//!
//! Trust on first use, made reviewable: every key is printed beside its node
//! with whether it is new, unchanged or CHANGED against the file being
//! merged, and nothing is written until a person confirms (or passes
//! `--yes`). A changed key is refused unless `--accept-changed`: it is what
//! a machine in the middle looks like. The file is validated by the engine's
//! own loader before it replaces the old one (temp file + rename).

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use nightshift_engine::api::{Inventory, NodeDefaults, NodeSpec};

use crate::Fail;
use crate::cmd::usage;
use crate::out::Out;

/// What `fleet import` was asked to do.
pub struct ImportOpts {
    pub out: PathBuf,
    /// Slurm's topology (topology.conf or `scontrol show topology`): each
    /// node's leaf switch as label `switch`.
    pub topology: Option<PathBuf>,
    pub port: u16,
    pub labels: Vec<String>,
    pub timeout: Duration,
    pub yes: bool,
    pub skip_unreachable: bool,
    pub accept_changed: bool,
}

/// A node as a source lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub name: String,
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub standby: bool,
    pub power_saving: bool,
}

/// A source that does not read as expected: where and what.
#[derive(Debug, PartialEq)]
pub struct SourceError {
    pub line: usize,
    pub message: String,
}

impl std::error::Error for SourceError {}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// `Key=Value` fields of one `scontrol show node` record. A token without
/// `=` belongs to the value before it (`Reason=not responding [slurm@…]`).
fn fields(record: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for tok in record.split_whitespace() {
        match tok.split_once('=') {
            Some((k, v)) if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
                out.push((k.to_string(), v.to_string()))
            }
            _ => match out.last_mut() {
                Some((_, v)) => {
                    v.push(' ');
                    v.push_str(tok);
                }
                None => out.push((String::new(), tok.to_string())),
            },
        }
    }
    out
}

/// Nodes from `scontrol --oneliner show nodes` (one record a line), or the
/// plain `scontrol show nodes` layout (a record continues on indented lines).
pub fn parse_slurm(text: &str) -> Result<Vec<Listed>, SourceError> {
    let mut records: Vec<(usize, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(char::is_whitespace)
            && let Some((_, r)) = records.last_mut()
        {
            r.push(' ');
            r.push_str(line.trim());
            continue;
        }
        records.push((i + 1, line.trim().to_string()));
    }
    let mut nodes = Vec::new();
    for (line, record) in records {
        let f = fields(&record);
        let get = |k: &str| f.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        let Some(name) = get("NodeName").filter(|n| !n.is_empty()) else {
            let found: String = record.chars().take(60).collect();
            return Err(SourceError {
                line,
                message: format!(
                    "expected a node record starting `NodeName=` (the output of `scontrol --oneliner show nodes`), found {found:?}"
                ),
            });
        };
        let address = get("NodeAddr").filter(|a| !a.is_empty() && *a != "(null)").unwrap_or(name).to_string();
        let mut labels = BTreeMap::new();
        let partitions: Vec<&str> = get("Partitions").unwrap_or("").split(',').filter(|p| !p.is_empty()).collect();
        if let Some(p) = partitions.first() {
            labels.insert("pool".to_string(), p.to_string());
        }
        if partitions.len() > 1 {
            labels.insert("partitions".to_string(), partitions.join(","));
        }
        if let Some((model, count)) = get("Gres").and_then(gpus_of_gres) {
            if let Some(m) = model {
                labels.insert("gpu_model".to_string(), m);
            }
            labels.insert("gpu_count".to_string(), count.to_string());
        }
        let state = get("State").unwrap_or("");
        nodes.push(Listed {
            name: name.to_string(),
            address,
            labels,
            standby: false,
            power_saving: state.contains("POWERED_DOWN") || state.contains("POWERING") || state.contains("CLOUD"),
        });
    }
    Ok(nodes)
}

/// The GPUs a Slurm `Gres=` value names: `gpu:h100:8(S:0-1)` → the model
/// (`h100`; none for a bare `gpu:8`) and the count, summed over every
/// `gpu` entry (`gpu:h100:4,gpu:h100:4` → 8). None: no GPU in it.
fn gpus_of_gres(gres: &str) -> Option<(Option<String>, u64)> {
    let mut model = None;
    let mut total = 0u64;
    let mut any = false;
    // Split on commas outside parentheses (`(S:0-1)` holds none, but an
    // index list may: `(IDX:0,2)`).
    let mut depth = 0i32;
    let mut items = vec![String::new()];
    for c in gres.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        if let Some(last) = items.last_mut() {
            last.push(c);
        }
    }
    for item in items {
        let item = item.split('(').next().unwrap_or("").trim();
        let mut parts = item.split(':');
        if parts.next() != Some("gpu") {
            continue;
        }
        let rest: Vec<&str> = parts.collect();
        let (m, n) = match rest.as_slice() {
            [n] => (None, n.parse::<u64>().ok()),
            [m, n, ..] => (Some(m.to_string()), n.parse::<u64>().ok()),
            [] => (None, None),
        };
        if let Some(n) = n {
            any = true;
            total = total.saturating_add(n);
            model = model.or(m);
        }
    }
    any.then_some((model, total))
}

/// Each node's leaf switch from Slurm's topology — `scontrol show
/// topology` (`SwitchName=s1 Level=0 … Nodes=gpu[01-04]`) or topology.conf
/// (`SwitchName=s1 Nodes=gpu[01-04]`; a switch over switches lists
/// `Switches=` only): the lowest-level switch that lists the node.
pub fn parse_topology(text: &str) -> Result<BTreeMap<String, String>, SourceError> {
    let mut best: BTreeMap<String, (u32, String)> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |message: String| SourceError { line: i + 1, message };
        let f = fields(line);
        let get = |k: &str| f.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        let Some(switch) = get("SwitchName").filter(|s| !s.is_empty()) else {
            let found: String = line.chars().take(60).collect();
            return Err(err(format!(
                "expected a switch line starting `SwitchName=` (topology.conf or `scontrol show topology`), found {found:?}"
            )));
        };
        let Some(nodes) = get("Nodes").filter(|n| !n.is_empty()) else { continue };
        let level = match get("Level") {
            Some(l) => l.parse::<u32>().map_err(|_| err(format!("Level: expected a whole number, found {l:?}")))?,
            None => 0,
        };
        for node in expand_hostlist(nodes).map_err(err)? {
            match best.get(&node) {
                Some((l, _)) if *l <= level => {}
                _ => {
                    best.insert(node, (level, switch.to_string()));
                }
            }
        }
    }
    Ok(best.into_iter().map(|(n, (_, s))| (n, s)).collect())
}

/// A Slurm hostlist: `gpu[01-04,07],cpu1` → gpu01 … gpu04, gpu07, cpu1
/// (zero padding kept; commas inside brackets separate ranges).
fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    let mut out = Vec::new();
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        let Some(open) = item.find('[') else {
            out.push(item.to_string());
            continue;
        };
        let close = item.find(']').filter(|c| *c > open).ok_or_else(|| format!("unclosed `[` in {item:?}"))?;
        let (head, tail) = (&item[..open], &item[close + 1..]);
        for range in item[open + 1..close].split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let (a, b) = match (lo.parse::<u64>(), hi.parse::<u64>()) {
                (Ok(a), Ok(b)) if a <= b && b - a < 100_000 => (a, b),
                _ => return Err(format!("expected ranges like [01-04,07] in {item:?}, found {range:?}")),
            };
            let width = lo.len();
            for n in a..=b {
                out.push(format!("{head}{n:0width$}{tail}"));
            }
        }
    }
    Ok(out)
}

/// `gpu[01:04]` → gpu01 … gpu04 (Ansible's numeric host ranges).
fn expand_range(pattern: &str) -> Result<Vec<String>, String> {
    let Some(open) = pattern.find('[') else { return Ok(vec![pattern.to_string()]) };
    let close = pattern[open..].find(']').map(|c| open + c).ok_or_else(|| format!("unclosed `[` in {pattern:?}"))?;
    let (lo, hi) = pattern[open + 1..close]
        .split_once(':')
        .ok_or_else(|| format!("expected a range like [01:10] in {pattern:?}"))?;
    let (a, b) = match (lo.parse::<u64>(), hi.parse::<u64>()) {
        (Ok(a), Ok(b)) if a <= b && b - a < 100_000 => (a, b),
        _ => return Err(format!("expected a range from low to high like [01:10] in {pattern:?}")),
    };
    let width = if lo.starts_with('0') { lo.len() } else { 0 };
    let mut out = Vec::new();
    for n in a..=b {
        let head = format!("{}{n:0width$}", &pattern[..open]);
        for tail in expand_range(&pattern[close + 1..])? {
            out.push(format!("{head}{tail}"));
        }
    }
    Ok(out)
}

fn unquote(v: &str) -> &str {
    v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v)
}

/// Nodes from an INI inventory: `[group]` sections (`:vars` and
/// `:children` sections are not hosts), host lines `name [key=value …]`.
/// `ansible_host` is the address; other `ansible_*` variables are
/// Ansible's own; `nightshift_standby=true` marks a spare; every other
/// variable is a label, and the group is label `pool` unless set.
pub fn parse_inventory(text: &str) -> Result<Vec<Listed>, SourceError> {
    let mut group: Option<String> = None;
    let mut nodes: Vec<Listed> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let err = |message: String| SourceError { line: i + 1, message };
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(sec) = line.strip_prefix('[') {
            let sec = sec.strip_suffix(']').ok_or_else(|| err(format!("expected `[group]`, found {line:?}")))?;
            group = if sec.contains(':') { None } else { Some(sec.to_string()) };
            continue;
        }
        // Lines of a :vars or :children section.
        let Some(g) = &group else { continue };
        let mut toks = line.split_whitespace();
        let pattern = toks.next().unwrap_or_default();
        let mut labels = BTreeMap::new();
        let mut address = None;
        let mut standby = false;
        for t in toks {
            let (k, v) =
                t.split_once('=').ok_or_else(|| err(format!("expected key=value after the host name, found {t:?}")))?;
            let v = unquote(v);
            match k {
                "ansible_host" => address = Some(v.to_string()),
                "nightshift_standby" => {
                    standby = match v {
                        "true" | "True" | "yes" => true,
                        "false" | "False" | "no" => false,
                        _ => return Err(err(format!("nightshift_standby: expected true or false, found {v:?}"))),
                    }
                }
                k if k.starts_with("ansible_") => {}
                k => {
                    labels.insert(k.to_string(), v.to_string());
                }
            }
        }
        labels.entry("pool".to_string()).or_insert_with(|| g.clone());
        if address.is_some() && pattern.contains('[') {
            return Err(err(format!("ansible_host on a host range ({pattern}) would give every host one address")));
        }
        for name in expand_range(pattern).map_err(err)? {
            if nodes.iter().any(|n| n.name == name) {
                // A host in two groups: the first group's line is the node's.
                continue;
            }
            let address = address.clone().unwrap_or_else(|| name.clone());
            nodes.push(Listed { name, address, labels: labels.clone(), standby, power_saving: false });
        }
    }
    Ok(nodes)
}

/// How a node's collected key compares with the file it is merged into.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyState {
    New,
    Unchanged,
    Changed { was: String },
    Unreachable(String),
}

/// One row of the review table.
#[derive(Debug, Clone)]
pub struct Row {
    pub spec: NodeSpec,
    pub key: KeyState,
}

/// Merge the listed nodes into `existing`: a node already there keeps its
/// address, labels (the source's fill in what is missing; the `given`
/// --labels of this import replace), standby and power saving; its key is
/// compared. Nodes only in the file stay.
pub fn merge(
    existing: Option<&Inventory>,
    listed: &[Listed],
    keys: &BTreeMap<String, Result<String, String>>,
    given: &BTreeMap<String, String>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for l in listed {
        let old = existing.and_then(|inv| inv.nodes.iter().find(|n| n.name == l.name));
        let found = keys.get(&l.name).cloned().unwrap_or_else(|| Err("not scanned".into()));
        let mut spec = match old {
            Some(o) => {
                let mut o = o.clone();
                for (k, v) in &l.labels {
                    o.labels.entry(k.clone()).or_insert_with(|| v.clone());
                }
                // A --label on this import is said now: it wins over the
                // file's (the source's own labels only fill in).
                for (k, v) in given {
                    o.labels.insert(k.clone(), v.clone());
                }
                o
            }
            None => NodeSpec {
                name: l.name.clone(),
                address: l.address.clone(),
                host_key: String::new(),
                labels: l.labels.clone(),
                standby: l.standby,
                power_saving: l.power_saving,
            },
        };
        let key = match (found, old) {
            (Err(e), _) => KeyState::Unreachable(e),
            (Ok(k), Some(o)) if o.host_key == k => KeyState::Unchanged,
            (Ok(k), Some(o)) => {
                let was = o.host_key.clone();
                spec.host_key = k;
                KeyState::Changed { was }
            }
            (Ok(k), None) => {
                spec.host_key = k;
                KeyState::New
            }
        };
        rows.push(Row { spec, key });
    }
    rows
}

fn read_source(path: &Path) -> Result<String> {
    let mut text = String::new();
    if path == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).context("reading the node list from stdin")?;
    } else {
        text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    }
    Ok(text)
}

/// Ask on the terminal (stdin may be the node list).
fn confirm(question: &str, stdin_used: bool) -> Result<bool> {
    eprint!("{question} [y/N] ");
    std::io::stderr().flush().ok();
    let mut line = String::new();
    if !stdin_used && std::io::stdin().is_terminal() {
        std::io::stdin().lock().read_line(&mut line)?;
    } else {
        match std::fs::File::open("/dev/tty") {
            Ok(tty) => {
                std::io::BufReader::new(tty).read_line(&mut line)?;
            }
            Err(_) => {
                eprintln!();
                return Err(anyhow::Error::new(Fail(3))
                    .context("no terminal to confirm on: review the keys above and pass --yes to write them"));
            }
        }
    }
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

pub async fn import(out: &Out, slurm: Option<&Path>, inventory: Option<&Path>, o: ImportOpts) -> Result<u8> {
    let (source, listed) = match (slurm, inventory) {
        (Some(p), _) => (p, parse_slurm(&read_source(p)?)),
        (None, Some(p)) => (p, parse_inventory(&read_source(p)?)),
        (None, None) => return Err(usage("pass --slurm FILE (scontrol --oneliner show nodes) or --inventory FILE")),
    };
    let mut listed = listed.map_err(|e| usage(format!("{}:{e}", source.display())))?;
    // Each node's leaf switch, from Slurm's topology: label `switch`.
    if let Some(t) = &o.topology {
        let text = std::fs::read_to_string(t).with_context(|| format!("cannot read {}", t.display()))?;
        let switches = parse_topology(&text).map_err(|e| usage(format!("{}:{e}", t.display())))?;
        for n in &mut listed {
            if let Some(sw) = switches.get(&n.name) {
                n.labels.entry("switch".to_string()).or_insert_with(|| sw.clone());
            }
        }
    }
    if listed.is_empty() {
        return Err(usage(format!("{}: expected at least one node, found none", source.display())));
    }
    let mut extra = BTreeMap::new();
    for l in &o.labels {
        let (k, v) = l.split_once('=').ok_or_else(|| usage(format!("--label: expected KEY=VALUE, found {l:?}")))?;
        extra.insert(k.to_string(), v.to_string());
    }
    for n in &mut listed {
        for (k, v) in &extra {
            n.labels.insert(k.clone(), v.clone());
        }
    }
    let existing = if o.out.exists() {
        Some(
            Inventory::load(&o.out)
                .map_err(|e| usage(format!("{e} (the file to merge into; fix it or choose another --out)")))?,
        )
    } else {
        None
    };
    let defaults = NodeDefaults { port: o.port, ..existing.as_ref().map(|i| i.defaults.clone()).unwrap_or_default() };

    // Collect the keys, 64 agents at a time.
    let addrs: Vec<(String, String)> = listed
        .iter()
        .map(|l| {
            let addr = existing
                .as_ref()
                .and_then(|inv| inv.nodes.iter().find(|n| n.name == l.name))
                .map(|n| n.addr(&defaults))
                .unwrap_or_else(|| {
                    NodeSpec {
                        name: l.name.clone(),
                        address: l.address.clone(),
                        host_key: String::new(),
                        labels: BTreeMap::new(),
                        standby: false,
                        power_saving: false,
                    }
                    .addr(&defaults)
                });
            (l.name.clone(), addr)
        })
        .collect();
    eprintln!("collecting host keys from {} agents …", addrs.len());
    let timeout = o.timeout;
    let keys: BTreeMap<String, Result<String, String>> = futures::stream::iter(addrs.clone())
        .map(|(name, addr)| async move {
            let r = nightshift_proto::ssh::client::scan_host_key(&addr, timeout).await.map_err(|e| e.to_string());
            (name, r)
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let rows = merge(existing.as_ref(), &listed, &keys, &extra);

    // The review table.
    let w = rows.iter().map(|r| r.spec.name.len()).max().unwrap_or(4).max(4);
    let aw = addrs.iter().map(|(_, a)| a.len()).max().unwrap_or(7).max(7);
    outln!("{:w$}  {:aw$}  {:51}  {}", "NODE", "ADDRESS", "HOST KEY", "KEY");
    let (mut new, mut changed, mut unreachable) = (0, 0, 0);
    for (r, (_, addr)) in rows.iter().zip(&addrs) {
        let (key, state) = match &r.key {
            KeyState::New => {
                new += 1;
                (r.spec.host_key.clone(), out.yellow("new"))
            }
            KeyState::Unchanged => (r.spec.host_key.clone(), out.green("unchanged")),
            KeyState::Changed { was } => {
                changed += 1;
                (r.spec.host_key.clone(), out.red(&format!("CHANGED (was {was})")))
            }
            KeyState::Unreachable(e) => {
                unreachable += 1;
                ("-".to_string(), out.red(&format!("unreachable: {e}")))
            }
        };
        outln!("{:w$}  {addr:aw$}  {key:51}  {state}", r.spec.name);
    }
    let kept: Vec<&NodeSpec> = existing
        .as_ref()
        .map(|inv| inv.nodes.iter().filter(|n| !listed.iter().any(|l| l.name == n.name)).collect())
        .unwrap_or_default();
    for n in &kept {
        outln!("{:w$}  {:aw$}  {:51}  {}", n.name, n.addr(&defaults), n.host_key, out.dim("kept (not in the source)"));
    }
    if unreachable > 0 && !o.skip_unreachable {
        eprintln!(
            "error: {unreachable} agent(s) did not present a host key; nothing written (start their agents, or pass --skip-unreachable to write the others)"
        );
        return Ok(4);
    }
    if changed > 0 && !o.accept_changed {
        eprintln!(
            "error: {changed} host key(s) differ from {}: nothing written. If those nodes were reinstalled, compare with `nightshift-agent fingerprint` on each and pass --accept-changed; otherwise something answers in their place",
            o.out.display()
        );
        return Ok(3);
    }
    let mut nodes: Vec<NodeSpec> = existing.as_ref().map(|inv| inv.nodes.clone()).unwrap_or_default();
    // Nodes whose labels this import changes (a --label, a switch or a
    // GPU model the source now names): written even with no new key.
    let relabelled = rows
        .iter()
        .filter(|r| !matches!(r.key, KeyState::Unreachable(_)))
        .filter(|r| nodes.iter().any(|n| n.name == r.spec.name && n.labels != r.spec.labels))
        .count();
    for r in rows.into_iter().filter(|r| !matches!(r.key, KeyState::Unreachable(_))) {
        match nodes.iter_mut().find(|n| n.name == r.spec.name) {
            Some(n) => *n = r.spec,
            None => nodes.push(r.spec),
        }
    }
    if new == 0 && changed == 0 && relabelled == 0 && existing.is_some() {
        outln!("{} is up to date ({} nodes)", o.out.display(), nodes.len());
        return Ok(0);
    }
    // Two hosts at one address, or answering with one host key, are one
    // agent under two names: a release on one would change the other.
    let inv = Inventory { version: 1, defaults, nodes };
    if let Err(e) = Inventory::parse(&serde_yaml::to_string(&inv)?, &o.out) {
        eprintln!("error: {}: nothing written", e.message);
        return Ok(2);
    }
    let Inventory { defaults, nodes, .. } = inv;
    if !o.yes {
        let q = format!(
            "write {} nodes to {} ({new} new host keys, {changed} changed, {relabelled} relabelled)? Compare each with `nightshift-agent fingerprint` on its node",
            nodes.len(),
            o.out.display()
        );
        if !confirm(&q, source == Path::new("-"))? {
            eprintln!("nothing written");
            return Ok(3);
        }
    }
    let inv = Inventory { version: 1, defaults, nodes };
    let body = serde_yaml::to_string(&inv)?;
    let text = format!(
        "# fleet.yaml written by `nightshift fleet import` from {}: host keys collected\n# over SSH (trust on first use) and confirmed by the person who ran it.\n{body}",
        source.display()
    );
    Inventory::parse(&text, &o.out).map_err(|e| anyhow::anyhow!("the written inventory does not load (a bug): {e}"))?;
    let dir = o.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(&o.out).with_context(|| format!("cannot replace {}", o.out.display()))?;
    outln!("wrote {} ({} nodes); reload the engine to use it: nightshift reload", o.out.display(), inv.nodes.len());
    Ok(0)
}

/// `nightshift fleet mode [MODE] [--reason R]`: show the whole fleet's
/// mode, or set it (admin, audited).
pub async fn mode(cli: &crate::args::Cli, out: &Out, mode: Option<&str>, reason: Option<&str>) -> Result<u8> {
    let v = match mode {
        None => {
            let mut c = crate::cmd::conn(cli, out)?;
            let v = c.fleet_mode().await?;
            c.close().await;
            v
        }
        Some(m) => {
            let Some(reason) = reason.filter(|r| !r.trim().is_empty()) else {
                return Err(usage(format!(
                    "--reason: expected why the fleet goes to {m} (kept in the audit record), found none"
                )));
            };
            let mode: nightshift_engine::api::FleetMode = serde_json::from_value(serde_json::Value::from(m))
                .map_err(|_| usage(format!("MODE: expected act, shadow or paused, found {m:?}")))?;
            let mut c = crate::cmd::conn_announced(cli, out)?;
            c.set_fleet_mode(mode, reason).await?
        }
    };
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    let m = v.mode.as_str();
    let what = match m {
        "act" => "each runbook acts in its own mode (runbooks list shows it)",
        "shadow" => "every automatic run sends its actions as dry runs and records what it would have done",
        "paused" => "no automatic run starts; runs already going go on; a faulted GPU is told to a person",
        _ => "",
    };
    let who = match &v.set_by {
        Some(by) => format!("set by {by}: {}", v.reason),
        None => "initial_fleet_mode in engine.yaml: nobody set one yet".to_string(),
    };
    outln!("the fleet is in {m} mode: {what} ({who})");
    // After a change: what it ended, and what is still going.
    for id in v.ended.iter().flatten() {
        outln!("  ended shadow run {} (it held its target; the real run can start)", crate::out::clean(id));
    }
    if let Some(going) = &v.in_flight {
        if going.is_empty() {
            outln!("  no run in flight");
        } else {
            outln!("  still in flight ({}):", going.len());
            for r in going {
                outln!("    {}", crate::out::clean(r));
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_records_in_both_layouts() {
        let oneliner = "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.1 NodeHostName=gpu01 Partitions=a,b State=IDLE Reason=not responding [slurm@2026-01-01T00:00:00]\n\
                        NodeName=gpu02 NodeAddr=10.0.0.2 Partitions=b State=IDLE+CLOUD+POWERED_DOWN\n";
        let plain = "NodeName=gpu01 Arch=x86_64 CoresPerSocket=1\n   NodeAddr=10.0.0.1 NodeHostName=gpu01\n   Partitions=a,b\n   State=IDLE\n\nNodeName=gpu02 NodeAddr=10.0.0.2\n   Partitions=b State=IDLE+CLOUD+POWERED_DOWN\n";
        for text in [oneliner, plain] {
            let n = parse_slurm(text).unwrap();
            assert_eq!(n.len(), 2);
            assert_eq!((n[0].name.as_str(), n[0].address.as_str()), ("gpu01", "10.0.0.1"));
            assert_eq!(n[0].labels.get("pool").map(String::as_str), Some("a"));
            assert!(!n[0].power_saving);
            assert!(n[1].power_saving);
        }
    }

    #[test]
    fn bad_sources_say_where_and_what() {
        type Parse = fn(&str) -> Result<Vec<Listed>, SourceError>;
        let cases: &[(&str, Parse, &str)] = &[
            (
                "Node gpu01 not found\n",
                parse_slurm,
                "line 1: expected a node record starting `NodeName=` (the output of `scontrol --oneliner show nodes`), found \"Node gpu01 not found\"",
            ),
            ("[gpu\nh1\n", parse_inventory, "line 1: expected `[group]`, found \"[gpu\""),
            ("[gpu]\nh1 pool\n", parse_inventory, "line 2: expected key=value after the host name, found \"pool\""),
            ("[gpu]\nh[01-02]\n", parse_inventory, "line 2: expected a range like [01:10] in \"h[01-02]\""),
            (
                "[gpu]\nh[01:02] ansible_host=10.0.0.1\n",
                parse_inventory,
                "line 2: ansible_host on a host range (h[01:02]) would give every host one address",
            ),
            (
                "[gpu]\nh1 nightshift_standby=maybe\n",
                parse_inventory,
                "line 2: nightshift_standby: expected true or false, found \"maybe\"",
            ),
        ];
        for (text, parse, want) in cases {
            assert_eq!(parse(text).unwrap_err().to_string(), *want, "{text:?}");
        }
    }

    #[test]
    fn slurm_partitions_and_gres_become_labels() {
        let text = "NodeName=g01 NodeAddr=10.0.0.1 Gres=gpu:h100:8(S:0-1) Partitions=train,debug State=IDLE\n\
                    NodeName=g02 Gres=gpu:4 Partitions=infer State=MIXED\n\
                    NodeName=g03 Gres=gpu:a100:4(IDX:0-3),gpu:a100:4,nvme:1 Partitions= State=IDLE\n\
                    NodeName=c01 Gres=(null) Partitions=cpu State=IDLE\n";
        let n = parse_slurm(text).unwrap();
        let labels = |i: usize| n[i].labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        assert_eq!(labels(0), ["gpu_count=8", "gpu_model=h100", "partitions=train,debug", "pool=train"]);
        assert_eq!(labels(1), ["gpu_count=4", "pool=infer"]);
        assert_eq!(labels(2), ["gpu_count=8", "gpu_model=a100"]);
        assert_eq!(labels(3), ["pool=cpu"]);
    }

    #[test]
    fn topology_gives_each_node_its_leaf_switch() {
        // `scontrol show topology`: the spine lists every node too, at a
        // higher level; the leaf wins.
        let shown = "SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu[01-06] Switches=leaf[1-2]\n\
                     SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu[01-03]\n\
                     SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=gpu[04-05,06]\n";
        // topology.conf: leaves list Nodes=, the spine Switches= only.
        let conf = "# fabric\nSwitchName=leaf1 Nodes=gpu[01-03]\nSwitchName=leaf2 Nodes=gpu04,gpu[05-06]\nSwitchName=spine Switches=leaf[1-2]\n";
        for text in [shown, conf] {
            let t = parse_topology(text).unwrap();
            let want: BTreeMap<String, String> =
                (1..=6).map(|i| (format!("gpu{i:02}"), if i <= 3 { "leaf1" } else { "leaf2" }.to_string())).collect();
            assert_eq!(t, want, "{text}");
        }
        let cases = [
            (
                "NodeName=gpu01\n",
                "line 1: expected a switch line starting `SwitchName=` (topology.conf or `scontrol show topology`), found \"NodeName=gpu01\"",
            ),
            (
                "SwitchName=s Nodes=gpu[04-01]\n",
                "line 1: expected ranges like [01-04,07] in \"gpu[04-01]\", found \"04-01\"",
            ),
            ("\nSwitchName=s Level=x Nodes=a\n", "line 2: Level: expected a whole number, found \"x\""),
        ];
        for (text, want) in cases {
            assert_eq!(parse_topology(text).unwrap_err().to_string(), want, "{text:?}");
        }
    }

    #[test]
    fn the_shipped_inventory_reads() {
        let n = parse_inventory(include_str!("../../../examples/ansible/inventory.ini")).unwrap();
        assert_eq!(n.len(), 9);
        assert!(n.iter().any(|n| n.name == "gpu-a05" && n.standby && n.address == "10.0.1.5"));
        assert!(n.iter().all(|n| n.labels.contains_key("rack") && n.labels.contains_key("pool")));
    }

    #[test]
    fn inventory_groups_ranges_and_vars() {
        let text = "# fleet\n[pool_a]\ngpu-a[01:03] rack=r1\ngpu-a09 ansible_host=10.0.0.9 ansible_user=root pool=special nightshift_standby=true\n\
                    [pool_a:vars]\nansible_python_interpreter=/usr/bin/python3\n[all:children]\npool_a\n";
        let n = parse_inventory(text).unwrap();
        let names: Vec<&str> = n.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a09"]);
        assert_eq!(n[0].address, "gpu-a01");
        assert_eq!(n[0].labels, BTreeMap::from([("pool".into(), "pool_a".into()), ("rack".into(), "r1".into())]));
        assert_eq!(n[3].address, "10.0.0.9");
        assert_eq!(n[3].labels, BTreeMap::from([("pool".into(), "special".into())]));
        assert!(n[3].standby);
    }

    #[test]
    fn merging_keeps_what_a_person_wrote_and_flags_changed_keys() {
        let existing = Inventory::parse(
            "version: 1\nnodes:\n  - {name: a, address: 10.0.0.1:2300, host_key: 'SHA256:old', labels: {pool: p, rack: r9}, standby: true}\n  - {name: b, address: b, host_key: 'SHA256:bee'}\n",
            Path::new("fleet.yaml"),
        )
        .unwrap();
        let listed = vec![
            Listed {
                name: "a".into(),
                address: "a".into(),
                labels: BTreeMap::from([("pool".into(), "q".into()), ("gpu_model".into(), "h200".into())]),
                standby: false,
                power_saving: false,
            },
            Listed {
                name: "b".into(),
                address: "b".into(),
                labels: BTreeMap::new(),
                standby: false,
                power_saving: false,
            },
            Listed {
                name: "c".into(),
                address: "c".into(),
                labels: BTreeMap::new(),
                standby: false,
                power_saving: false,
            },
            Listed {
                name: "d".into(),
                address: "d".into(),
                labels: BTreeMap::new(),
                standby: false,
                power_saving: false,
            },
        ];
        let keys = BTreeMap::from([
            ("a".to_string(), Ok("SHA256:new".to_string())),
            ("b".to_string(), Ok("SHA256:bee".to_string())),
            ("c".to_string(), Ok("SHA256:sea".to_string())),
            ("d".to_string(), Err("connection refused".to_string())),
        ]);
        // A --label given on this import replaces the file's.
        let given = BTreeMap::from([("rack".to_string(), "r10".to_string())]);
        let relabelled = merge(Some(&existing), &listed, &keys, &given);
        assert_eq!(relabelled[0].spec.labels.get("rack").map(String::as_str), Some("r10"));
        assert_eq!(relabelled[0].spec.labels.get("pool").map(String::as_str), Some("p"));
        let rows = merge(Some(&existing), &listed, &keys, &BTreeMap::new());
        assert_eq!(rows[0].spec.labels.get("rack").map(String::as_str), Some("r9"));
        assert_eq!(rows[0].key, KeyState::Changed { was: "SHA256:old".into() });
        assert_eq!(rows[0].spec.address, "10.0.0.1:2300");
        assert_eq!(rows[0].spec.labels.get("pool").map(String::as_str), Some("p"), "the file's label wins");
        assert_eq!(rows[0].spec.labels.get("gpu_model").map(String::as_str), Some("h200"), "the source fills in");
        assert!(rows[0].spec.standby);
        assert_eq!(rows[1].key, KeyState::Unchanged);
        assert_eq!(rows[2].key, KeyState::New);
        assert_eq!(rows[2].spec.host_key, "SHA256:sea");
        assert_eq!(rows[3].key, KeyState::Unreachable("connection refused".into()));
    }
}
