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
