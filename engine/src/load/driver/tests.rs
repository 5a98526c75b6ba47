use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::LocalSet;

use super::conn::UserConns;
use super::ctx::new_ctx;
use super::deadline::watchdog;
use super::dry_run::simulate;
use super::objects::fetch_embedded;
use super::render::Req;
use super::request::{request, Prev};
use crate::load::http::Target;
use crate::load::workload::Workload;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type Seen = Arc<Mutex<Vec<String>>>;

/// A keep-alive HTTP/1.1 server: `reply(path)` gives (status, body, delay before answering);
/// returns its address, the paths requested in order and the connections accepted.
async fn serve(reply: fn(&str) -> (u16, String, u64)) -> (std::net::SocketAddr, Seen, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Seen = Arc::new(Mutex::new(vec![]));
    let conns = Arc::new(AtomicUsize::new(0));
    let (s2, c2) = (seen.clone(), conns.clone());
    tokio::task::spawn_local(async move {
        loop {
            let (mut sock, _) = l.accept().await.unwrap();
            c2.fetch_add(1, Ordering::SeqCst);
            let seen = s2.clone();
            tokio::task::spawn_local(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    seen.lock().unwrap().push(path.clone());
                    let (status, body, delay) = reply(&path);
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    let resp = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    if sock.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen, conns)
}

fn site(path: &str) -> (u16, String, u64) {
    if path.starts_with("/page") {
        // 5 distinct objects on the target (one twice, one elsewhere, one data: URL)
        let body = "<html><img src=\"/img/a.gif\"><IMG SRC='/img/b.gif'> <img src=\"img/c.gif\">\
            <img src=\"/img/a.gif\"> <img src=\"http://example.com/x.gif\"> <img src=\"data:image/gif;base64,AA\">\
            <input type=\"image\" src=\"/img/d.gif\"> <img alt=\"t\" src=\"/img/e.gif\"></html>";
        (200, body.to_string(), 10)
    } else if path.contains("missing") {
        (404, "no".into(), 0)
    } else if path.contains("busy") {
        (503, "busy".into(), 0)
    } else {
        (200, "GIF89a-image-bytes".into(), 40)
    }
}

fn workload(extra: &str) -> Workload {
    let text = format!("[workload]\nstart = \"P\"\n[users]\ncount = 1\n{extra}\n[[pages]]\nname = \"P\"\nurl = \"/page\"\n");
    crate::load::workload::parse(&text, Path::new("t.toml")).unwrap()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    LocalSet::new().block_on(&rt, f)
}

/// 10 objects, 4 connections, 40 ms each: three rounds (>= 120 ms), 4 connections opened
/// once and kept alive for the next page; every object requested exactly once; 404s are
/// failed objects, 503s and unreachable objects are page errors.
#[test]
fn embedded_pool_fetches_each_object_once_on_at_most_n_kept_alive_connections() {
    block_on(async {
        let (addr, seen, conns) = serve(site).await;
        let ctx = new_ctx(workload("[embedded]\nconnections = 4"), Target::parse(&format!("http://{addr}")).unwrap(), None, 1);
        tokio::task::spawn_local(watchdog(ctx.clone()));
        let urls: Vec<String> = (0..10).map(|i| format!("/img/{i}.gif")).collect();
        let mut pool = vec![];
        let t = Instant::now();
        let out = fetch_embedded(&ctx, &urls, &mut pool, 4, false).await;
        let el = t.elapsed();
        assert_eq!((out.count, out.failed, out.errors), (10, 0, 0));
        assert_eq!(out.bytes, 10 * "HTTP/1.1 200 X\r\nContent-Length: 18\r\n\r\nGIF89a-image-bytes".len() as u64);
        assert!(el >= Duration::from_millis(120) && el < Duration::from_millis(400), "{el:?}");
        assert_eq!(conns.load(Ordering::SeqCst), 4);
        assert_eq!(pool.len(), 4);
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        let mut want = urls.clone();
        want.sort();
        assert_eq!(got, want);
        // the next page: the kept-alive connections are reused
        let out = fetch_embedded(&ctx, &urls[..3], &mut pool, 4, false).await;
        assert_eq!(out.count, 3);
        assert_eq!(conns.load(Ordering::SeqCst), 4);
        assert_eq!(pool.len(), 4);
        // one connection only: strictly sequential
        let mut one = vec![];
        let t = Instant::now();
        fetch_embedded(&ctx, &urls[..3], &mut one, 1, false).await;
        assert!(t.elapsed() >= Duration::from_millis(120));
        assert_eq!(one.len(), 1);
        // 404: a failed object, not a page error; 503: both
        let bad = vec!["/img/missing.gif".to_string(), "/img/busy.gif".to_string(), "/img/ok.gif".to_string()];
        let out = fetch_embedded(&ctx, &bad, &mut pool, 4, false).await;
        assert_eq!((out.count, out.failed, out.errors), (3, 2, 1));
    });
}

/// The page's logged time runs from its request to the last byte of its last object; the
/// row counts the objects; the objects are not rows.
#[test]
fn page_time_includes_its_embedded_objects() {
    block_on(async {
        let (addr, seen, conns) = serve(site).await;
        let ctx = new_ctx(workload("[embedded]\nconnections = 4"), Target::parse(&format!("http://{addr}")).unwrap(), None, 1);
        tokio::task::spawn_local(watchdog(ctx.clone()));
        let mut uc = UserConns::default();
        let req = Req { path: Arc::from("/page"), form: None };
        let out = request(&ctx, 0, 0, 0, &req, 0.0, &mut uc, Prev::default()).await;
        assert_eq!(out.error, None);
        let batch = ctx.batch.borrow();
        assert_eq!(batch.len(), 1);
        let r = &batch[0];
        assert_eq!(r.embedded, Some(5));
        assert_eq!(r.embedded_failed, 0);
        // page 10 ms, then 5 objects of 40 ms on 4 connections: two rounds
        let ms = (r.end_ns - r.start_ns) as f64 / 1e6;
        assert!(ms >= 90.0, "{ms} ms");
        assert!(r.first_byte_ns - r.start_ns < 80_000_000);
        let mut got = seen.lock().unwrap().clone();
        assert_eq!(got[0], "/page");
        got.sort();
        assert_eq!(got, vec!["/img/a.gif", "/img/b.gif", "/img/c.gif", "/img/d.gif", "/img/e.gif", "/page"]);
        assert_eq!(conns.load(Ordering::SeqCst), 1 + 4);
        assert!(uc.page.is_some() && uc.embedded.len() == 4);
        assert!((out.end_s - ctx.now_s()).abs() < 0.05);
    });
}

/// TPC-W USMD: without END a session ends only at a move to the start page after its
/// minimum duration; sessions last at least the mean of the truncated draw.
#[test]
fn sessions_end_at_home_after_their_minimum_duration() {
    let text = "[workload]\nstart = \"H\"\nmax_transitions = 100000\nsession_min_mean_s = 60\n[think]\nmean_s = 1.0\n\
        [[pages]]\nname = \"H\"\nurl = \"/h\"\n[[pages]]\nname = \"A\"\nurl = \"/a\"\n\
        [transitions]\nH = { A = 0.9 }\nA = { H = 0.5, A = 0.5 }\n";
    let wl = crate::load::workload::parse(text, Path::new("t.toml")).unwrap();
    assert_eq!(wl.session_min_max_s, 240.0);
    let out: Value = serde_json::from_str(&simulate(&wl, 400_000, 3)).unwrap();
    let d = &out["dry_run"];
    let sessions = d["sessions"].as_u64().unwrap();
    assert_eq!(d["end"], 0);
    assert!(d["session_min_ends"].as_u64().unwrap() + 1 >= sessions);
    // E[min(X, 240)] = 60 (1 - e^-4) = 58.9 s, plus the wait for the next move to H
    // (about 2.5 s of think here); 400k requests at ~1 s: ~6,000 sessions
    let mean_s = d["mean_session_s"].as_f64().unwrap();
    assert!((58.0..66.0).contains(&mean_s), "mean session {mean_s} s over {sessions}");
}
