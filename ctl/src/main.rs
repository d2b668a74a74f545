//! dipamctl: see `dipamctl --help`. All logic is in this crate's library.

/// The crate version and the git commit it was built from (build.rs, shared with dipamd).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("DIPAM_GIT_COMMIT"),
    ")"
);

fn main() -> std::process::ExitCode {
    use dipam_ctl::{self as ctl, CtlError, output};
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let args = match ctl::parse(VERSION, argv.iter().cloned()) {
        Ok(args) => args,
        Err(e) => return output::usage(e, ctl::json_requested(&argv)),
    };
    let json = args.json();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let e = CtlError::Failed(format!("cannot start the async runtime: {e}"));
            return output::exit(Err(e), json);
        }
    };
    let result = rt.block_on(ctl::run(args, &mut std::io::stdout().lock()));
    output::exit(result, json)
}
