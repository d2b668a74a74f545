//! dipamctl: see `dipamctl --help`. All logic is in the dipam-shim library (`ctl/`).

/// The crate version and the git commit it was built from (shim-server/build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("DIPAM_GIT_COMMIT"),
    ")"
);

fn main() -> std::process::ExitCode {
    let args: dipam_shim::ctl::Args = dipam_shim::parse_args(VERSION);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dipamctl: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(dipam_shim::ctl::run(args, &mut std::io::stdout().lock()));
    dipam_shim::ctl::output::exit(result)
}
