//! Setup commands: `keygen`, `token`, `completions`.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::args::Cli;
use crate::cmd::usage;

/// Generate the engine's SSH key and print what agents need.
pub fn keygen(cli: &Cli, path: Option<&Path>, force: bool) -> Result<u8> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => nightshift_engine::config::EngineConfig::load(&cli.config)
            .map(|c| c.engine_key_path)
            .unwrap_or_else(|_| PathBuf::from("engine_key")),
    };
    if path.exists() && !force {
        return Err(usage(format!(
            "{} already exists: pass --force to replace it (agents will need the new .pub)",
            path.display()
        )));
    }
    let key = nightshift_proto::ssh::keys::generate("nightshift-engine")?;
    nightshift_proto::ssh::keys::write_keypair(&key, &path)?;
    let public = key.public_key().to_openssh()?;
    outln!("wrote {} (mode 0600) and {}", path.display(), nightshift_proto::ssh::keys::pub_path(&path).display());
    outln!("fingerprint {}", nightshift_proto::ssh::keys::fingerprint(key.public_key()));
    outln!("add this line to every agent's authorized_keys:\n{public}");
    Ok(0)
}

/// Make an API token (or, with `webhook`, an Alertmanager webhook token)
/// and print the config line that grants it.
pub fn token(name: &str, role: &str, webhook: bool) -> Result<u8> {
    let role_ok = ["viewer", "operator", "admin"].contains(&role);
    if !role_ok {
        return Err(usage(format!("--role: expected viewer, operator or admin, found {role:?}")));
    }
    if !nightshift_engine::config::valid_token_name(name) {
        return Err(usage(format!(
            "--name: expected 1 to 64 letters, digits or `._-@` (the name the audit shows), found {name:?}"
        )));
    }
    let bytes: [u8; 24] = rand::random();
    let token = format!("ns_{}", hex::encode(bytes));
    let sha = nightshift_web::auth::hash_token(&token);
    if webhook {
        outln!(
            "token (put it in Alertmanager's http_config.authorization.credentials; it is not stored anywhere): {token}"
        );
        outln!("add to engine.yaml under auth.webhook_tokens:");
        outln!("  - {{name: {name}, sha256: {sha}}}");
    } else {
        outln!("token (give it to {name}; it is not stored anywhere): {token}");
        outln!("add to engine.yaml under auth.tokens:");
        outln!("  - {{name: {name}, role: {role}, sha256: {sha}}}");
    }
    Ok(0)
}

/// Print the shell's completion script. It registers nightshift's dynamic
/// completer: the shell calls `nightshift` back with `COMPLETE=<shell>` for
/// commands, flags and runbook, node and run names.
pub fn completions(shell: clap_complete::Shell) -> Result<u8> {
    use clap_complete::env::EnvCompleter;
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(str::to_string))
        .unwrap_or_else(|| "nightshift".into());
    // Into a buffer first: a closed pipe must not panic.
    let mut buf = Vec::new();
    let shells: [&dyn EnvCompleter; 5] = [
        &clap_complete::env::Bash,
        &clap_complete::env::Zsh,
        &clap_complete::env::Fish,
        &clap_complete::env::Elvish,
        &clap_complete::env::Powershell,
    ];
    let name = shell.to_string();
    let Some(sh) = shells.iter().find(|s| s.is(&name)) else {
        return Err(usage(format!("completions: expected bash, zsh, fish, elvish or powershell, found {name}")));
    };
    sh.write_registration("COMPLETE", "nightshift", "nightshift", &bin, &mut buf)?;
    crate::out::write_bytes(&buf);
    Ok(0)
}
