//! RMA evidence: a node's agent gathers what the GPU vendor asks for with a
//! return (`collect_evidence`: `nvidia-bug-report.sh` or `amd-smi`
//! reports, and its last health check) into a hashed bundle on the node;
//! the engine puts the bundle's files and the SHA-256 of its manifest on
//! the audit chain (`evidence_collected`), where `nightshift audit verify
//! --evidence DIR` checks a copy against it.

use nightshift_proto::{CollectEvidenceArgs, EvidenceChunk, EvidenceCollected, Op, ReadEvidenceArgs, Request};

use crate::audit::{NewRecord, RecordKind};
use crate::engine::{Engine, EvidenceReadError};

impl Engine {
    /// [`Engine::read_evidence`]'s work (the façade, `engine.rs`, forwards here).
    pub(crate) async fn evidence_chunk(
        &self,
        node: &str,
        bundle: &str,
        file: &str,
        offset: u64,
    ) -> Result<EvidenceChunk, EvidenceReadError> {
        let n = self
            .core
            .fleet()
            .get(node)
            .ok_or_else(|| EvidenceReadError::NotFound(format!("no node {node:?} in the inventory")))?;
        let op = Op::ReadEvidence(ReadEvidenceArgs { bundle: bundle.into(), file: file.into(), offset });
        let r = n
            .transport
            .call(Request::new(self.core.ids().request("evidence-read"), op))
            .await
            .map_err(|e| EvidenceReadError::Unreachable(e.to_string()))?;
        if !r.ok {
            let e = r.error.unwrap_or_else(|| nightshift_proto::ErrorBody {
                code: nightshift_proto::ErrorCode::Internal,
                message: "the agent refused without saying why".into(),
            });
            return Err(match e.code {
                nightshift_proto::ErrorCode::NotFound => EvidenceReadError::NotFound(e.message),
                nightshift_proto::ErrorCode::BadRequest => EvidenceReadError::BadName(e.message),
                _ => EvidenceReadError::Unreachable(e.message),
            });
        }
        let c: EvidenceChunk = serde_json::from_value(r.result.unwrap_or_default())
            .map_err(|e| EvidenceReadError::Unreachable(format!("the agent's evidence piece does not read: {e}")))?;
        if hex::decode(&c.data_hex).is_err() {
            return Err(EvidenceReadError::Unreachable("the agent's evidence piece is not hex".into()));
        }
        Ok(c)
    }

    /// Ask `node`'s agent for an evidence bundle (of `gpu`, or the node)
    /// and audit what came back — the bundle and its hash, or why there is
    /// none — under `by` (and `run`, when a run asked).
    pub(crate) async fn collect_evidence(
        &self,
        node: &str,
        gpu: Option<u32>,
        reason: &str,
        run: Option<&str>,
        by: &str,
    ) -> Result<EvidenceCollected, String> {
        let result = match self.core.fleet().get(node) {
            None => Err(format!("unknown node {node}")),
            Some(n) => {
                let op = Op::CollectEvidence(CollectEvidenceArgs { gpu, reason: reason.to_string() });
                match n.transport.call(Request::new(self.core.ids().request("evidence"), op)).await {
                    Ok(r) if r.ok => serde_json::from_value::<EvidenceCollected>(r.result.unwrap_or_default())
                        .map_err(|e| format!("the agent's evidence reply does not read: {e}")),
                    Ok(r) => Err(r.error.map(|e| e.message).unwrap_or_default()),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        let data = match &result {
            Ok(c) => crate::audit::data::EvidenceCollected {
                bundle: c.bundle.id.clone(),
                dir: c.dir.clone(),
                sha256: c.sha256.clone(),
                reason: reason.to_string(),
                files: c.bundle.files.clone(),
                error: None,
            },
            Err(e) => crate::audit::data::EvidenceCollected {
                reason: reason.to_string(),
                error: Some(e.clone()),
                ..Default::default()
            },
        };
        let mut rec = NewRecord::typed(RecordKind::EvidenceCollected, by, &data).node(Some(node)).gpu(gpu);
        if let Some(r) = run {
            rec = rec.run(r);
        }
        self.core.audit().append(rec, None).await.map_err(|e| format!("cannot audit the evidence: {e}"))?;
        match &result {
            Ok(c) => tracing::info!(node, bundle = %c.bundle.id, sha256 = %c.sha256, "RMA evidence collected"),
            Err(e) => tracing::warn!(node, error = %e, "RMA evidence not collected"),
        }
        result
    }
}
