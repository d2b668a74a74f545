// Shared by the build scripts of dipamd (shim-server/build.rs) and dipamctl (ctl/build.rs),
// through `include!`: both binaries show the same `--version`.

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// Sets `DIPAM_GIT_COMMIT` for the binaries, and reruns the build script when HEAD moves.
fn emit_git_commit() {
    println!("cargo:rerun-if-env-changed=DIPAM_GIT_COMMIT");
    let commit = std::env::var("DIPAM_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DIPAM_GIT_COMMIT={commit}");
    // Rerun when HEAD moves: HEAD itself (a checkout or a detached commit), the branch it
    // names (a new commit), and packed-refs (where a fetch may put that branch). Paths from
    // git itself, so a worktree's private HEAD is the one watched.
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in watch {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    // Without any rerun-if line cargo would rerun this for every file in the package.
    println!("cargo:rerun-if-changed=build.rs");
}
