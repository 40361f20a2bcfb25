//! Runs a program inside the file-system sandbox a systemd unit's
//! `ProtectSystem=strict` and `ReadWritePaths=` give it, for the tests that
//! check the shipped units (`tests/tests/it/operations.rs`) on machines where
//! systemd is not PID 1.
//!
//! `unit-sandbox ROOT [--rw PATH]... -- PROGRAM [ARG]...`: in a new mount
//! namespace, ROOT (standing for `/`) becomes read-only, then each PATH
//! under it is bind-mounted writable again, as systemd does; a PATH that
//! does not exist is skipped, as `-` does in `ReadWritePaths=-PATH`. Then
//! PROGRAM replaces this process. Needs CAP_SYS_ADMIN (root).
#![forbid(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("unit-sandbox: {what}: {e}");
    std::process::exit(111);
}

fn bind(path: &PathBuf, flags: MsFlags) {
    mount(Some(path), path, None::<&str>, MsFlags::MS_BIND | flags, None::<&str>)
        .unwrap_or_else(|e| fail(&format!("bind {}", path.display()), e));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(sep) = args.iter().position(|a| a == "--") else {
        eprintln!("usage: unit-sandbox ROOT [--rw PATH]... -- PROGRAM [ARG]...");
        std::process::exit(2);
    };
    let (opts, program) = (&args[..sep], &args[sep + 1..]);
    if opts.is_empty() || program.is_empty() {
        eprintln!("usage: unit-sandbox ROOT [--rw PATH]... -- PROGRAM [ARG]...");
        std::process::exit(2);
    }
    let root = PathBuf::from(&opts[0]);
    let mut rw = Vec::new();
    let mut it = opts[1..].iter();
    while let Some(o) = it.next() {
        match (o.as_str(), it.next()) {
            ("--rw", Some(p)) => rw.push(PathBuf::from(p)),
            _ => fail("arguments", format!("expected --rw PATH, found {o}")),
        }
    }
    unshare(CloneFlags::CLONE_NEWNS).unwrap_or_else(|e| fail("unshare(CLONE_NEWNS) (needs root)", e));
    // Nothing done here may reach the parent namespace.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .unwrap_or_else(|e| fail("make / private", e));
    bind(&root, MsFlags::MS_REC);
    bind(&root, MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY);
    for p in rw.iter().filter(|p| p.exists()) {
        // A bind mount starts with its source's flags (read-only here);
        // remounting it without MS_RDONLY makes it writable.
        bind(p, MsFlags::empty());
        bind(p, MsFlags::MS_REMOUNT);
    }
    let e = std::process::Command::new(&program[0]).args(&program[1..]).exec();
    fail(&format!("exec {}", program[0]), e);
}
