//! SIGHUP reloads the configuration (a binary of its own: the signal
//! reaches every reloader of the process).

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile_server::backend::InProcess;
use turnstile_server::reload::Reloader;
use turnstile_server::service::{Bounds, RateLimitService};

const CONFIG: &str = "\
domain: api
descriptors:
  - key: kept
    rate_limit: { unit: minute, requests_per_unit: 10 }
";

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads() {
    use tokio::signal::unix::{SignalKind, signal};
    // Our own handler first, so that a SIGHUP never takes the default
    // action (ending the test process) before the reloader's is installed.
    let _guard = signal(SignalKind::hangup()).unwrap();
    let dir = std::env::temp_dir().join(format!("turnstile-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("api.yaml"), CONFIG).unwrap();
    let reloader = Arc::new(Reloader::new(&dir, Arc::new(InProcess::default())));
    let config = reloader.load().unwrap();
    let service = Arc::new(RateLimitService::new(config, Bounds::default(), false));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // Polled once an hour: only the signal reloads.
    let watch = tokio::spawn(reloader.watch(
        Arc::clone(&service),
        Duration::from_secs(3_600),
        async move {
            let _ = stopped.await;
        },
    ));
    let start = Instant::now();
    while service.metrics().reloads().0 == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no reload on SIGHUP"
        );
        let status = std::process::Command::new("kill")
            .args(["-HUP", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(service.metrics().reloads().1, 0);
    let _ = stop.send(());
    watch.await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
