//! Helper processes (scontrol, kubectl, sync): argument vectors and a
//! timeout, never a shell. This is the only place the agent spawns anything.

use std::process::Stdio;
use std::time::Duration;

/// What a finished process printed.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcOutput {
    pub stdout: String,
    pub stderr: String,
}

/// Why a helper process did not succeed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProcError {
    #[error("cannot start `{program}`: {message}; is it installed and on PATH?")]
    Spawn { program: String, message: String },
    #[error("`{command}` did not finish within {secs} s and was killed")]
    Timeout { command: String, secs: u64 },
    #[error("`{command}` failed with exit status {code}: {stderr}")]
    Failed { command: String, code: i32, stderr: String },
}

/// Display an argument vector for messages (not for execution).
pub fn display(argv: &[String]) -> String {
    argv.iter()
        .map(|a| if a.contains(' ') || a.is_empty() { format!("{a:?}") } else { a.clone() })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run `argv` (program first) with no stdin, capturing output, killing it
/// after `timeout`.
pub async fn run(argv: &[String], timeout: Duration) -> Result<ProcOutput, ProcError> {
    run_with_env(argv, &[], timeout).await
}

/// [`run`], with `env` added to the inherited environment (for example
/// `SLURM_CONF` when Slurm's configuration is not in its default place).
pub async fn run_with_env(
    argv: &[String],
    env: &[(String, String)],
    timeout: Duration,
) -> Result<ProcOutput, ProcError> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| ProcError::Spawn { program: String::new(), message: "empty argument vector".into() })?;
    let child = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ProcError::Spawn { program: program.clone(), message: e.to_string() })?;
    let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(ProcError::Spawn { program: program.clone(), message: e.to_string() }),
        Err(_) => return Err(ProcError::Timeout { command: display(argv), secs: timeout.as_secs() }),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().chars().take(2000).collect::<String>();
    if !out.status.success() {
        return Err(ProcError::Failed { command: display(argv), code: out.status.code().unwrap_or(-1), stderr });
    }
    Ok(ProcOutput { stdout, stderr })
}

/// How [`run_to_file`] ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Captured {
    /// Bytes written to the file.
    pub bytes: u64,
    /// What went wrong: the size limit (the process was killed and the
    /// file holds its first `max_bytes`), the timeout, or a failed exit.
    pub error: Option<String>,
}

/// Run `argv` with its stdout written to `out`, at most `max_bytes` of it:
/// past that the process is killed, as it is after `timeout`. What it
/// wrote until then stays in the file either way.
pub async fn run_to_file(
    argv: &[String],
    timeout: Duration,
    out: &std::path::Path,
    max_bytes: u64,
) -> Result<Captured, ProcError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| ProcError::Spawn { program: String::new(), message: "empty argument vector".into() })?;
    let io = |e: std::io::Error| ProcError::Spawn { program: program.clone(), message: e.to_string() };
    // Its own process group: a tool that starts others (a bug report
    // runs dozens) is stopped whole at the timeout, not just its shell.
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(io)?;
    let group = child.id();
    let mut file = tokio::fs::File::create(out).await.map_err(io)?;
    let mut stdout = child.stdout.take().ok_or_else(|| io(std::io::Error::other("no stdout")))?;
    let mut written = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let copy = async {
        loop {
            let n = stdout.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(None);
            }
            let room = max_bytes.saturating_sub(written) as usize;
            file.write_all(&buf[..n.min(room)]).await?;
            written += n.min(room) as u64;
            if n > room {
                return Ok(Some(format!("cut at the size limit of {max_bytes} bytes")));
            }
        }
    };
    let error = match tokio::time::timeout(timeout, copy).await {
        Ok(Ok(None)) => match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(st)) if st.success() => None,
            Ok(Ok(st)) => Some(format!("`{}` failed with exit status {}", display(argv), st.code().unwrap_or(-1))),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("`{}` did not finish within {} s and was killed", display(argv), timeout.as_secs())),
        },
        Ok(Ok(Some(limit))) => Some(limit),
        Ok(Err(e)) => Some(format!("reading `{}`: {e}", display(argv))),
        Err(_) => Some(format!("`{}` did not finish within {} s and was killed", display(argv), timeout.as_secs())),
    };
    if error.is_some()
        && let Some(pgid) = group
    {
        // `kill` by argument vector (no signal call here: this crate has no
        // unsafe code) for the whole group.
        let kill = ["kill".to_string(), "-KILL".into(), "--".into(), format!("-{pgid}")];
        let _ = run(&kill, Duration::from_secs(5)).await;
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
    file.flush().await.map_err(io)?;
    file.sync_all().await.map_err(io)?;
    Ok(Captured { bytes: written, error })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn arguments_are_not_interpreted_by_a_shell() {
        let out = run(&argv(&["echo", "a; rm -rf /", "$HOME"]), Duration::from_secs(5)).await.unwrap();
        assert_eq!(out.stdout, "a; rm -rf / $HOME\n");
    }

    #[tokio::test]
    async fn extra_environment_reaches_the_process() {
        let env = [("SLURM_CONF".to_string(), "/etc/slurm/test.conf".to_string())];
        let out = run_with_env(&argv(&["printenv", "SLURM_CONF"]), &env, Duration::from_secs(5)).await.unwrap();
        assert_eq!(out.stdout, "/etc/slurm/test.conf\n");
    }

    #[tokio::test]
    async fn a_hung_process_is_killed_at_the_timeout() {
        let t = std::time::Instant::now();
        let err = run(&argv(&["sleep", "30"]), Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(err, ProcError::Timeout { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn failures_carry_status_and_stderr() {
        let err = run(&argv(&["ls", "/definitely/not/here"]), Duration::from_secs(5)).await.unwrap_err();
        let ProcError::Failed { code, stderr, .. } = err else { panic!("{err}") };
        assert_ne!(code, 0);
        assert!(stderr.contains("No such file"), "{stderr}");
        let err = run(&argv(&["no-such-binary-xyz"]), Duration::from_secs(5)).await.unwrap_err();
        assert!(err.to_string().contains("is it installed"), "{err}");
    }
}
