//! dipamd: see `dipamd --help` and docs/cfp.md. All logic is in the dipam-shim library.

/// The crate version and the git commit it was built from (shim-server/build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("DIPAM_GIT_COMMIT"),
    ")"
);

fn main() -> std::process::ExitCode {
    let args: dipam_shim::l7_daemon::daemon::Args = dipam_shim::parse_args(VERSION);
    dipam_shim::l7_daemon::daemon::tune_allocator();
    dipam_shim::l7_daemon::daemon::private_umask();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dipamd: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // On a worker, not on this thread: the server's accept loop then hands each connection to
    // the worker it runs on, instead of waking another thread (~0.15 ms per request, measured).
    let served =
        rt.block_on(async { tokio::spawn(dipam_shim::l7_daemon::daemon::run(args)).await });
    // A plain drop would wait for every blocking task, such as a delegate exec the shutdown
    // drain cut short (up to --delegate-timeout): the exit after SIGTERM must stay bounded.
    rt.shutdown_timeout(dipam_shim::l7_daemon::daemon::EXIT_WAIT);
    match served
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
    {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dipamd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
