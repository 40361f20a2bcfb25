//! The wire protocol between the engine and an agent: versioned JSON request
//! and reply objects. Types only — no I/O lives here.
//!
//! One request is one SSH `exec` whose command is a JSON object:
//!
//! ```json
//! {"v":1,"id":"r-17","op":"set_power_limit","args":{"gpu":0,"watts":450},"dry_run":false}
//! ```
//!
//! and the reply is one JSON object on stdout:
//!
//! ```json
//! {"v":1,"id":"r-17","ok":true,"result":{"outcome":"applied","before":{..},"after":{..}}}
//! ```
//!
//! Parsing is strict: unknown fields and wrong types are refused with a message
//! that names the field ([`Request::parse`]).

mod action;
mod holds;
mod telemetry;

pub use action::*;
pub use holds::*;
pub use telemetry::*;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The only protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Default upper bound on the size of one request, in bytes.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 64 * 1024;

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Caller-chosen unique id; a repeated id returns the recorded reply.
    pub id: String,
    /// The operation and its arguments.
    pub op: Op,
    /// Check and describe the change without applying it.
    pub dry_run: bool,
    /// The lease of the hold this request places, in seconds: the agent
    /// releases it on its own clock, whether or not the engine is still
    /// there. Absent: the policy's `default_lease_secs`.
    pub revert_after_secs: Option<u64>,
    /// Who asks: a run id, `person:<name>`, or absent (`manual`). Holds are
    /// owned by it; `release` and `renew` act on its holds.
    pub owner: Option<String>,
    /// The sending engine's leader term (HA): an agent refuses a mutating
    /// request whose term is below the highest it has seen (`stale_leader`),
    /// so a deposed leader's requests already in flight do nothing. Absent
    /// for a single engine.
    pub term: Option<u64>,
    /// The sending leader's lease deadline (HA), in ms since the Unix epoch
    /// on the fleet's wall clock: the leader was sure of its lease until
    /// then, no longer. An agent refuses a mutating request it handles
    /// later (`stale_leader`), so a leader frozen between its check and the
    /// send cannot act after a takeover even where the new leader has not
    /// reached this agent yet. Absent for a single engine.
    pub not_after_ms: Option<i64>,
}

/// The JSON shape of a request, before the arguments are typed.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    v: u32,
    id: String,
    op: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    args: Value,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revert_after_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    term: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    not_after_ms: Option<i64>,
}

/// Why a request could not be parsed. The reply carries `code` and the
/// `Display` text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("request is not valid JSON for the request envelope: {0}")]
    Envelope(String),
    #[error("unsupported protocol version: expected {PROTOCOL_VERSION}, found {0}")]
    Version(u32),
    #[error("unknown op `{found}`: expected one of {expected}")]
    UnknownOp { found: String, expected: String },
    #[error("bad args for `{op}`: {message}")]
    Args { op: String, message: String },
    #[error("request id must be 1 to 128 characters, found {0} characters")]
    Id(usize),
    #[error("owner must be 1 to 128 characters without control characters, found {0:?}")]
    Owner(String),
}

impl ParseError {
    /// The stable error code a reply carries for this parse failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            ParseError::Version(_) => ErrorCode::UnsupportedVersion,
            ParseError::UnknownOp { .. } => ErrorCode::UnknownOp,
            _ => ErrorCode::BadRequest,
        }
    }
}

macro_rules! ops {
    ($( $(#[$doc:meta])* $variant:ident($args:ty) = $name:literal, mutating = $mutating:literal, kind = $kind:expr; )*) => {
        /// An operation with its typed arguments.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Op {
            $( $(#[$doc])* $variant($args), )*
        }

        /// Every op name, in protocol order.
        pub const OP_NAMES: &[&str] = &[$($name),*];

        impl Op {
            /// The op's wire name.
            pub fn name(&self) -> &'static str {
                match self { $( Op::$variant(_) => $name, )* }
            }

            /// Whether the op changes hardware or node state (and so is
            /// checked against the envelope, journaled and audited).
            pub fn is_mutating(&self) -> bool {
                match self { $( Op::$variant(_) => $mutating, )* }
            }

            /// Whether the op with this wire name mutates.
            pub fn is_mutating_name(name: &str) -> bool {
                match name { $( $name => $mutating, )* _ => false }
            }

            /// The rate-limit family the op belongs to, if it mutates.
            pub fn kind(&self) -> Option<ActionKind> {
                match self { $( Op::$variant(_) => $kind, )* }
            }

            /// The op's arguments as JSON (what goes on the wire as `args`).
            pub fn args(&self) -> Value {
                match self { $( Op::$variant(a) => serde_json::to_value(a).unwrap_or(Value::Null), )* }
            }

            fn from_parts(op: &str, args: Value) -> Result<Op, ParseError> {
                // `null` (args omitted) reads as an empty object.
                let args = if args.is_null() { Value::Object(Default::default()) } else { args };
                match op {
                    $( $name => serde_json::from_value::<$args>(args)
                        .map(Op::$variant)
                        .map_err(|e| ParseError::Args { op: op.to_string(), message: e.to_string() }), )*
                    other => Err(ParseError::UnknownOp {
                        found: other.chars().take(64).collect(),
                        expected: OP_NAMES.join(", "),
                    }),
                }
            }
        }
    };
}

ops! {
    /// The node's GPUs and what they support.
    Inventory(NoArgs) = "inventory", mutating = false, kind = None;
    /// One telemetry sample of every GPU and the node.
    Telemetry(NoArgs) = "telemetry", mutating = false, kind = None;
    /// A stream of telemetry samples, one JSON line each.
    Subscribe(SubscribeArgs) = "subscribe", mutating = false, kind = None;
    /// The recorded reply of an earlier request, by id.
    ActionStatus(ActionStatusArgs) = "action_status", mutating = false, kind = None;
    /// Set a GPU's power limit.
    SetPowerLimit(SetPowerLimitArgs) = "set_power_limit", mutating = true, kind = Some(ActionKind::PowerLimit);
    /// Hand a GPU's fan to a temperature→speed curve the agent runs.
    SetFanCurve(SetFanCurveArgs) = "set_fan_curve", mutating = true, kind = Some(ActionKind::Fan);
    /// Give a GPU's fan back to firmware control.
    ResetFan(GpuArgs) = "reset_fan", mutating = true, kind = Some(ActionKind::Fan);
    /// Lock a GPU's clocks to a range.
    SetClocks(SetClocksArgs) = "set_clocks", mutating = true, kind = Some(ActionKind::Clocks);
    /// Unlock a GPU's clocks.
    ResetClocks(GpuArgs) = "reset_clocks", mutating = true, kind = Some(ActionKind::Clocks);
    /// Clear a GPU's volatile ECC counters.
    ClearEcc(GpuArgs) = "clear_ecc", mutating = true, kind = Some(ActionKind::Ecc);
    /// Set a GPU's NVML drain state.
    SetGpuDrain(SetGpuDrainArgs) = "set_gpu_drain", mutating = true, kind = Some(ActionKind::GpuDrain);
    /// Drain the node through the scheduler adapter.
    Drain(DrainArgs) = "drain", mutating = true, kind = Some(ActionKind::NodeDrain);
    /// Resume a node nightshift drained.
    Resume(ResumeArgs) = "resume", mutating = true, kind = Some(ActionKind::NodeDrain);
    /// Move the jobs off a drained node: requeue them (Slurm) or evict them
    /// (Kubernetes). A drain alone stops new work, not running jobs.
    Requeue(RequeueArgs) = "requeue", mutating = true, kind = Some(ActionKind::NodeDrain);
    /// Drop the OS page cache and signal registered GPU processes.
    FlushCaches(FlushCachesArgs) = "flush_caches", mutating = true, kind = Some(ActionKind::FlushCaches);
    /// Managed config files and their history.
    ConfigList(ConfigListArgs) = "config_list", mutating = false, kind = None;
    /// Write a new version of a managed config file.
    ConfigApply(ConfigApplyArgs) = "config_apply", mutating = true, kind = Some(ActionKind::Config);
    /// Go back to the last known good (or a named) version.
    ConfigRollback(ConfigRollbackArgs) = "config_rollback", mutating = true, kind = Some(ActionKind::Config);
    /// Mark a version good or bad.
    ConfigMark(ConfigMarkArgs) = "config_mark", mutating = true, kind = Some(ActionKind::Config);
    /// Simulated hardware only: inject or clear a fault (journaled).
    SimFault(SimFault) = "sim_fault", mutating = false, kind = None;
    /// Every held setting: baseline, effective value, holds.
    Holds(NoArgs) = "holds", mutating = false, kind = None;
    /// Release holds by id or owner; restores baselines the last hold leaves.
    Release(ReleaseArgs) = "release", mutating = true, kind = None;
    /// Renew the lease of holds (and keep them past their run).
    Renew(RenewArgs) = "renew", mutating = true, kind = None;
    /// Is the node fit to take work: GPUs visible, no row-remap failure or
    /// pending remap, ECC stable, PCIe at its width, NVLink up, no fatal
    /// XID since the last reset (`dcgmi diag -r 1` where DCGM is installed).
    HealthCheck(HealthCheckArgs) = "health_check", mutating = false, kind = None;
    /// The work waiting in the scheduler's queue (H4 reads it with power).
    SchedulerPending(SchedulerPendingArgs) = "scheduler_pending", mutating = false, kind = None;
    /// Gather the vendor's RMA evidence into a hashed bundle on the node
    /// (files only: no hardware changes).
    CollectEvidence(CollectEvidenceArgs) = "collect_evidence", mutating = false, kind = None;
    /// A piece of one file of an evidence bundle (read-only).
    ReadEvidence(ReadEvidenceArgs) = "read_evidence", mutating = false, kind = None;
    /// The chassis fans at full speed through the BMC (a hold), or back on
    /// the BMC's control.
    SetChassisFans(SetChassisFansArgs) = "set_chassis_fans", mutating = true, kind = Some(ActionKind::ChassisFans);
    /// Power a standby node up or down through the scheduler's power saving.
    PowerNode(PowerNodeArgs) = "power_node", mutating = true, kind = Some(ActionKind::Power);
    /// Set or clear a scheduler mark (`no_pack`, `quarantine`).
    Mark(MarkArgs) = "mark", mutating = true, kind = Some(ActionKind::Mark);
}

impl Op {
    /// How long a reply may take at least, where the op runs the vendor's
    /// own tools on the node (a bug report takes minutes): the client
    /// waits this long, not its usual request timeout.
    pub fn reply_within(&self) -> Option<std::time::Duration> {
        match self {
            // The agent's `evidence.timeout_secs` (≤ 600) for each of up
            // to three tools.
            Op::CollectEvidence(_) => Some(std::time::Duration::from_secs(1800)),
            _ => None,
        }
    }
}

impl Request {
    /// A request with a fresh op, not a dry run, no lease.
    pub fn new(id: impl Into<String>, op: Op) -> Request {
        Request {
            id: id.into(),
            op,
            dry_run: false,
            revert_after_secs: None,
            owner: None,
            term: None,
            not_after_ms: None,
        }
    }

    /// Parse one request. Refuses unknown fields, wrong types, unknown ops
    /// and other protocol versions, naming what was expected and found.
    pub fn parse(bytes: &[u8]) -> Result<Request, ParseError> {
        // A key given twice (`"watts": 600, "watts": 100` in `args`) is
        // refused: the last would win while a reader sees the first.
        crate::json::check_no_duplicate_keys(bytes).map_err(ParseError::Envelope)?;
        let raw: RawRequest = serde_json::from_slice(bytes).map_err(|e| ParseError::Envelope(e.to_string()))?;
        if raw.v != PROTOCOL_VERSION {
            return Err(ParseError::Version(raw.v));
        }
        if raw.id.is_empty() || raw.id.len() > 128 {
            return Err(ParseError::Id(raw.id.len()));
        }
        if let Some(o) = &raw.owner
            && (o.is_empty() || o.len() > 128 || o.chars().any(char::is_control))
        {
            return Err(ParseError::Owner(o.chars().take(64).collect()));
        }
        let op = Op::from_parts(&raw.op, raw.args)?;
        Ok(Request {
            id: raw.id,
            op,
            dry_run: raw.dry_run,
            revert_after_secs: raw.revert_after_secs,
            owner: raw.owner,
            term: raw.term,
            not_after_ms: raw.not_after_ms,
        })
    }

    /// Best effort: the `id` of a request that failed to parse, so the error
    /// reply can still be matched by the caller.
    pub fn salvage_id(bytes: &[u8]) -> String {
        serde_json::from_slice::<Value>(bytes)
            .ok()
            .and_then(|v| v.get("id").and_then(Value::as_str).map(|s| s.chars().take(128).collect()))
            .unwrap_or_default()
    }

    /// The request as one line of JSON.
    pub fn to_json(&self) -> String {
        let raw = RawRequest {
            v: PROTOCOL_VERSION,
            id: self.id.clone(),
            op: self.op.name().to_string(),
            args: self.op.args(),
            dry_run: self.dry_run,
            revert_after_secs: self.revert_after_secs,
            owner: self.owner.clone(),
            term: self.term,
            not_after_ms: self.not_after_ms,
        };
        serde_json::to_string(&raw).unwrap_or_default()
    }

    /// A stable digest of the request's meaning (op, args, dry-run, lease),
    /// used to tell a true repeat from an id reused for something else.
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut copy = self.clone();
        copy.id = String::new();
        // Who leads, and until when, is not what the request means.
        copy.term = None;
        copy.not_after_ms = None;
        hex::encode(Sha256::digest(copy.to_json().as_bytes()))
    }
}

/// Stable error codes. The names are part of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed JSON, unknown or mistyped fields.
    BadRequest,
    /// `v` is not a version this agent speaks.
    UnsupportedVersion,
    /// `op` is not an operation this agent knows.
    UnknownOp,
    /// The request is larger than the agent accepts.
    TooLarge,
    /// The value falls outside the agent's safety envelope.
    OutOfEnvelope,
    /// Too many changes of this kind in the window.
    RateLimited,
    /// A maintenance marker makes every mutating op refuse.
    HandsOff,
    /// The node was drained by someone else; nightshift does not undo it.
    NotOwner,
    /// A named thing (GPU, config, version, request id) does not exist.
    NotFound,
    /// The id was already used for a different request.
    Conflict,
    /// The same id is being applied right now.
    InProgress,
    /// The agent stopped while applying this id; it will not re-apply it.
    Indeterminate,
    /// The hardware library failed.
    BackendError,
    /// A helper process (scontrol, kubectl, sync) failed.
    ProcessFailed,
    /// A helper process or the backend did not answer in time.
    Timeout,
    /// A bug in the agent.
    Internal,
    /// The request carries a leader term lower than one the agent has seen
    /// (a deposed engine).
    StaleLeader,
    /// The node failed its health check: it does not go back into service.
    Unhealthy,
}

impl ErrorCode {
    /// The wire name of the code.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::OutOfEnvelope => "out_of_envelope",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::HandsOff => "hands_off",
            ErrorCode::NotOwner => "not_owner",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::InProgress => "in_progress",
            ErrorCode::Indeterminate => "indeterminate",
            ErrorCode::BackendError => "backend_error",
            ErrorCode::ProcessFailed => "process_failed",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Internal => "internal",
            ErrorCode::StaleLeader => "stale_leader",
            ErrorCode::Unhealthy => "unhealthy",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error part of a failed reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// One reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    pub v: u32,
    pub id: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Reply {
    /// A successful reply carrying `result`.
    pub fn ok(id: impl Into<String>, result: Value) -> Reply {
        Reply { v: PROTOCOL_VERSION, id: id.into(), ok: true, result: Some(result), error: None }
    }

    /// A refusal or failure.
    pub fn err(id: impl Into<String>, code: ErrorCode, message: impl Into<String>) -> Reply {
        Reply {
            v: PROTOCOL_VERSION,
            id: id.into(),
            ok: false,
            result: None,
            error: Some(ErrorBody { code, message: message.into() }),
        }
    }

    /// The reply as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse a reply (strict, like requests).
    pub fn parse(bytes: &[u8]) -> Result<Reply, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("reply is not valid: {e}"))
    }

    /// The result decoded as a [`ReleaseResult`], for `release`.
    pub fn release(&self) -> Option<ReleaseResult> {
        self.result.as_ref().and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// The result decoded as an [`ActionResult`], for mutating ops.
    pub fn action(&self) -> Option<ActionResult> {
        self.result.as_ref().and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// The error code, if the reply is a failure.
    pub fn code(&self) -> Option<ErrorCode> {
        self.error.as_ref().map(|e| e.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_well_formed_request() {
        let req =
            Request::parse(br#"{"v":1,"id":"r1","op":"set_power_limit","args":{"gpu":0,"watts":450},"dry_run":true}"#)
                .unwrap();
        assert_eq!(req.id, "r1");
        assert!(req.dry_run);
        assert_eq!(req.op, Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 450.0 }));
        assert!(req.op.is_mutating());
    }

    /// Regression (issue 27 item 10: duplicate keys inside `args` were
    /// accepted, the last one winning).
    #[test]
    fn a_key_given_twice_is_refused() {
        let e = Request::parse(br#"{"v":1,"id":"r1","op":"set_power_limit","args":{"gpu":0,"watts":600,"watts":100}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate key \"watts\": expected each key once in an object"), "{e}");
        let e = Request::parse(br#"{"v":1,"id":"r1","id":"r2","op":"holds","args":{}}"#).unwrap_err().to_string();
        assert!(e.contains("duplicate key \"id\""), "{e}");
    }

    #[test]
    fn request_round_trips_through_json() {
        let mut req = Request::new(
            "abc",
            Op::SetFanCurve(SetFanCurveArgs {
                gpu: 1,
                points: vec![FanPoint { temp_c: 40.0, speed_pct: 30.0 }, FanPoint { temp_c: 80.0, speed_pct: 100.0 }],
            }),
        );
        req.revert_after_secs = Some(60);
        let back = Request::parse(req.to_json().as_bytes()).unwrap();
        assert_eq!(back, req);
        assert_eq!(back.digest(), req.digest());
    }

    /// Table of malformed requests and the exact error each one gets.
    #[test]
    fn malformed_requests_are_refused_naming_the_field() {
        let cases: &[(&str, ErrorCode, &str)] = &[
            (
                r#"{"v":2,"id":"a","op":"inventory"}"#,
                ErrorCode::UnsupportedVersion,
                "unsupported protocol version: expected 1, found 2",
            ),
            (r#"{"v":1,"id":"a","op":"reboot"}"#, ErrorCode::UnknownOp, "unknown op `reboot`: expected one of"),
            (
                r#"{"v":1,"id":"a","op":"set_power_limit","args":{"gpu":0,"wats":5}}"#,
                ErrorCode::BadRequest,
                "bad args for `set_power_limit`: unknown field `wats`, expected `gpu` or `watts`",
            ),
            (
                r#"{"v":1,"id":"a","op":"set_power_limit","args":{"gpu":0,"watts":"high"}}"#,
                ErrorCode::BadRequest,
                "bad args for `set_power_limit`: invalid type: string \"high\", expected f64",
            ),
            (
                r#"{"v":1,"id":"a","op":"inventory","extra":1}"#,
                ErrorCode::BadRequest,
                "request is not valid JSON for the request envelope: unknown field `extra`",
            ),
            (r#"{"v":1,"op":"inventory"}"#, ErrorCode::BadRequest, "missing field `id`"),
            (r#"not json"#, ErrorCode::BadRequest, "expected ident at line 1 column 2"),
            (r#"{"v":1,"id":"","op":"inventory"}"#, ErrorCode::BadRequest, "request id must be 1 to 128"),
        ];
        for (input, code, needle) in cases {
            let err = Request::parse(input.as_bytes()).unwrap_err();
            assert_eq!(err.code(), *code, "input {input}");
            let text = err.to_string();
            assert!(text.contains(needle), "input {input}: message {text:?} lacks {needle:?}");
        }
    }

    #[test]
    fn owner_is_part_of_the_meaning_and_checked() {
        let mut a = Request::new("x", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 450.0 }));
        let mut b = a.clone();
        a.owner = Some("r1".into());
        b.owner = Some("r2".into());
        assert_ne!(a.digest(), b.digest(), "the same id with another owner is another request");
        assert_eq!(Request::parse(a.to_json().as_bytes()).unwrap(), a);
        let err = Request::parse(br#"{"v":1,"id":"a","op":"inventory","owner":"r1\nx"}"#).unwrap_err();
        assert_eq!(err.code(), ErrorCode::BadRequest);
        assert!(err.to_string().starts_with("owner must be 1 to 128 characters"), "{err}");
    }

    #[test]
    fn salvages_id_from_bad_requests() {
        assert_eq!(Request::salvage_id(br#"{"id":"x9","v":"bad"}"#), "x9");
        assert_eq!(Request::salvage_id(b"garbage"), "");
    }

    #[test]
    fn reply_error_shape_is_stable() {
        let r = Reply::err("r", ErrorCode::OutOfEnvelope, "too low");
        assert_eq!(
            r.to_json(),
            r#"{"v":1,"id":"r","ok":false,"error":{"code":"out_of_envelope","message":"too low"}}"#
        );
        assert_eq!(Reply::parse(r.to_json().as_bytes()).unwrap(), r);
    }
}
