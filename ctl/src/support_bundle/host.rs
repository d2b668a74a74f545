//! dipamd's command line and versions, found from the socket's peer, and its metrics.

use std::path::Path;

use serde_json::{Value, json};

use super::{
    Args, log,
    part::{Bundle, PartError, blocking},
};
use crate::{
    node_paths::NodePaths,
    offline::{self, ReadError},
};

/// dipamd's pid, from the socket's peer credentials: the process that listens is the one
/// whose flags and log matter, whatever its unit or pod is called. A dipamd that holds the
/// ledger in `state_dir` without listening (starting, or stuck before it serves) is found
/// through the ledger's lock instead.
fn dipamd_pid(socket: &Path, state_dir: &Path) -> Result<i32, PartError> {
    let stream = match std::os::unix::net::UnixStream::connect(socket) {
        Ok(s) => s,
        Err(source) => {
            return offline::ledger_holder(state_dir)
                .and_then(|p| i32::try_from(p).ok())
                .ok_or_else(|| PartError::NoDipamd {
                    socket: socket.to_owned(),
                    state_dir: state_dir.to_owned(),
                    source,
                });
        }
    };
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|source| PartError::PeerCred {
            socket: socket.to_owned(),
            source,
        })?;
    Ok(cred.pid())
}

/// dipamd's command line, one argument per line.
fn cmdline(pid: i32) -> Result<Vec<String>, PartError> {
    let path = format!("/proc/{pid}/cmdline");
    let raw = std::fs::read(&path).map_err(ReadError::io(path))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
}

/// The value of `flag` on a command line (`--flag value` or `--flag=value`).
fn flag_value(argv: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            argv.get(i + 1).cloned()
        } else {
            a.strip_prefix(&eq).map(str::to_owned)
        }
    })
}

/// Where dipamd serves its metrics: `--metrics-url` if given, else its `--metrics-socket` or
/// `--metrics-address` as its command line says.
fn metrics_target(url: Option<&str>, argv: Option<&[String]>) -> Option<String> {
    if let Some(u) = url {
        return Some(u.to_owned());
    }
    let argv = argv?;
    flag_value(argv, "--metrics-socket")
        .map(|p| format!("unix:{p}"))
        .or_else(|| flag_value(argv, "--metrics-address").map(|a| format!("http://{a}/metrics")))
}

/// GET on dipamd's plain-HTTP metrics endpoint: `http://HOST:PORT/PATH` (dipamd serves metrics
/// on loopback, without TLS) or `unix:PATH`.
async fn scrape(target: &str) -> Result<Vec<u8>, PartError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (host, path) = if let Some(p) = target.strip_prefix("unix:") {
        ("localhost", ("metrics", p))
    } else {
        let rest = target
            .strip_prefix("http://")
            .ok_or_else(|| PartError::MetricsTarget {
                target: target.to_owned(),
            })?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, "metrics"));
        (host, (path, ""))
    };
    let req = format!(
        "GET /{} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n",
        path.0
    );
    let mut all = Vec::new();
    let exchange = |source| PartError::Exchange {
        to: target.to_owned(),
        source,
    };
    if path.1.is_empty() {
        let mut s = tokio::net::TcpStream::connect(host)
            .await
            .map_err(exchange)?;
        s.write_all(req.as_bytes()).await.map_err(exchange)?;
        s.read_to_end(&mut all).await.map_err(exchange)?;
    } else {
        let mut s = tokio::net::UnixStream::connect(path.1)
            .await
            .map_err(exchange)?;
        s.write_all(req.as_bytes()).await.map_err(exchange)?;
        s.read_to_end(&mut all).await.map_err(exchange)?;
    }
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| PartError::NoHttpHeader(target.to_owned()))?;
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let status = head.lines().next().unwrap_or_default().to_owned();
    if !status.contains(" 200") {
        return Err(PartError::HttpStatus {
            target: target.to_owned(),
            status,
        });
    }
    Ok(all[split + 4..].to_vec())
}

/// dipamd's command line and versions, its metrics and its log. `paths`: where dipamd keeps
/// its ledger (its lock finds a dipamd that does not answer), and its metrics when its
/// command line cannot be read.
pub(super) async fn host_parts(b: &mut Bundle, socket: &Path, args: &Args, paths: &NodePaths) {
    let (owned, state_dir) = (socket.to_owned(), paths.state_dir.value.clone());
    let pid = blocking(move || dipamd_pid(&owned, &state_dir)).await;
    // Kept as text: both the versions part and the metrics part report it.
    let argv = match &pid {
        Ok(pid) => {
            let pid = *pid;
            blocking(move || cmdline(pid))
                .await
                .map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    let daemon_version = b
        .files
        .iter()
        .find(|(n, _)| n == "status.json")
        .and_then(|(_, s)| serde_json::from_slice::<Value>(s).ok())
        .map_or(Value::Null, |s| s["daemonVersion"].clone());
    b.part("dipamd command line and versions", "versions.json", async {
        let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let v = json!({
            "dipamctl": env!("CARGO_PKG_VERSION"),
            "dipamd": daemon_version,
            "dipamdCommandLine": argv.as_ref().map_or_else(|e| json!({"error": e}), |a| json!(a)),
            "kernel": kernel.trim(),
            "osRelease": os.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")).map(|s| s.trim_matches('"')),
        });
        Ok(serde_json::to_vec_pretty(&v)?)
    })
    .await;

    let target = metrics_target(args.metrics_url.as_deref(), argv.as_deref().ok())
        .or_else(|| paths.metrics.as_ref().map(|m| m.value.clone()));
    b.part("metrics", "metrics.txt", async {
        match (&target, &argv) {
            (Some(t), _) => scrape(t).await,
            (None, Err(e)) => Err(PartError::NoCommandLine(e.clone())),
            (None, Ok(_)) => Err(PartError::NoMetricsFlag),
        }
    })
    .await;

    let (file, unit, n) = (
        args.log_file.clone(),
        args.journal_unit.clone(),
        args.log_lines,
    );
    b.part_from("log", "dipamd.log", log::log(file, pid.ok(), unit, n))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_metrics_target_comes_from_the_flag_or_dipamds_command_line() {
        let a = argv("dipamd --state-dir /s --metrics-address 127.0.0.1:9646");
        assert_eq!(
            metrics_target(None, Some(&a)).as_deref(),
            Some("http://127.0.0.1:9646/metrics")
        );
        let a =
            argv("dipamd --metrics-socket=/run/dipam/metrics.sock --metrics-address 127.0.0.1:1");
        assert_eq!(
            metrics_target(None, Some(&a)).as_deref(),
            Some("unix:/run/dipam/metrics.sock")
        );
        assert_eq!(
            metrics_target(Some("http://x:1/m"), Some(&a)).as_deref(),
            Some("http://x:1/m")
        );
        assert_eq!(metrics_target(None, Some(&argv("dipamd"))), None);
        assert_eq!(metrics_target(None, None), None);
        // A flag at the end with no value is not a value.
        assert_eq!(
            flag_value(&argv("dipamd --metrics-address"), "--metrics-address"),
            None
        );
    }
}
