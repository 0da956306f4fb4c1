//! `idxfs bench acl`: what POSIX ACLs cost on the huge-dir workload's directory of empty
//! files, in one run: idxfs mounted `allow_other` (ACLs on by default; the kernel checks
//! permissions with or without them) with ACLs and with `-o noacl`, and mounted for root only
//! (ACLs off by default) without and with `-o acl`, beside the run's other file systems (ACLs
//! on: their default). Steps, each with cold caches: create the files, `ls -l`, `cp -a`
//! within the file system. For idxfs it also counts what the daemon was asked: GETXATTR and
//! GETATTR requests per file.
//!
//! Nothing here is asserted; it prints seconds, the ratio of ACLs on to off, and requests.
use crate::bench_env::{self, cpath, create_close, FsKind, Target};
use crate::bench_suite::Scale;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const STEPS: [&str; 3] = ["create", "ls -l", "cp -a"];

/// The idxfs mounts: (label, options). ACLs are on by default with `allow_other` and off on
/// a root-only mount (`MountConfig::acl_on`); each is also run the other way.
const IDXFS_RUNS: [(&str, &str); 4] = [
    ("idxfs allow_other (ACLs)", "allow_other"),
    ("idxfs allow_other,noacl", "allow_other,noacl"),
    ("idxfs root only, -o acl", "acl"),
    ("idxfs root only (no ACLs)", ""),
];

/// (ACLs on, ACLs off) label pairs for the ratio lines.
const PAIRS: [(&str, &str); 2] = [
    (IDXFS_RUNS[0].0, IDXFS_RUNS[1].0),
    (IDXFS_RUNS[2].0, IDXFS_RUNS[3].0),
];

/// One configuration's results: seconds per step, and for idxfs (GETXATTR, GETATTR) per step.
struct Run {
    label: &'static str,
    /// Who can reach the mount, for the ratio lines.
    mount: &'static str,
    seconds: [f64; 3],
    requests: Option<[(u64, u64); 3]>,
}

/// Seconds per step, and (GETXATTR, GETATTR) requests per step.
type Measured = ([f64; 3], [(u64, u64); 3]);

fn on(t: &mut Target, files: u64) -> Result<Measured, String> {
    let dir = t.mp.join("d");
    let mut secs = [0.0; 3];
    let mut asked = [(0, 0); 3];
    for (i, step) in STEPS.iter().enumerate() {
        t.cold_report()?;
        let start = Instant::now();
        match *step {
            "create" => {
                std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                for n in 0..files {
                    if n.is_multiple_of(4096) {
                        bench_env::interrupted()?;
                    }
                    let p = dir.join(format!("f{n:08}"));
                    create_close(&cpath(&p), &p)?;
                }
            }
            "ls -l" => {
                bench_env::run(Command::new("ls").arg("-l").arg(&dir))?;
            }
            _ => {
                bench_env::run(
                    Command::new("cp")
                        .arg("-a")
                        .arg(&dir)
                        .arg(t.mp.join("copy")),
                )?;
            }
        }
        secs[i] = start.elapsed().as_secs_f64();
        let report = t.cold_report()?;
        asked[i] = (
            bench_env::requests_of(&report, "getxattr"),
            bench_env::requests_of(&report, "getattr"),
        );
    }
    Ok((secs, asked))
}

pub fn acl(
    scale: Scale,
    files: Option<u64>,
    fs: &[FsKind],
    base: &Path,
) -> Result<(String, Value), String> {
    let files = files.unwrap_or(scale.pick(2_000, 100_000, 1_000_000));
    let bytes = (8u64 << 30) + files * 8192;
    let mut runs: Vec<(&'static str, FsKind, Option<&str>)> = Vec::new();
    if fs.contains(&FsKind::Idxfs) {
        for (label, opts) in IDXFS_RUNS {
            runs.push((label, FsKind::Idxfs, Some(opts)));
        }
    }
    for &k in fs.iter().filter(|k| **k != FsKind::Idxfs) {
        runs.push((k.name(), k, None));
    }
    let mut out = Vec::new();
    for (label, kind, opts) in runs {
        eprintln!("  acl on {label}");
        let mut t = Target::make_counted(base, kind, bytes, files * 3 + 65_536, opts)?;
        let (seconds, asked) = on(&mut t, files)?;
        out.push(Run {
            label,
            mount: if opts.is_some_and(|o| o.contains("allow_other")) {
                "allow_other"
            } else {
                "root only"
            },
            seconds,
            requests: (kind == FsKind::Idxfs).then_some(asked),
        });
    }
    Ok((table(&out, files), raw(&out, files)))
}

fn table(runs: &[Run], files: u64) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "acl: {files} empty files in one directory, seconds (cold caches before each step); \
         idxfs: GETXATTR and GETATTR requests per file"
    );
    let _ = write!(o, "{:<32}", "");
    for step in STEPS {
        let _ = write!(o, " {step:>8}");
    }
    for step in STEPS {
        let _ = write!(o, " {:>12}", format!("{step} x/a"));
    }
    let _ = writeln!(o);
    for r in runs {
        let _ = write!(o, "{:<32}", r.label);
        for s in r.seconds {
            let _ = write!(o, " {s:>8.2}");
        }
        if let Some(q) = r.requests {
            for (x, a) in q {
                let per = |n: u64| n as f64 / files as f64;
                let _ = write!(o, " {:>12}", format!("{:.2}/{:.2}", per(x), per(a)));
            }
        }
        let _ = writeln!(o);
    }
    for (on, off) in PAIRS {
        let find = |l: &str| runs.iter().find(|r| r.label == l);
        if let (Some(a), Some(b)) = (find(on), find(off)) {
            let _ = write!(o, "{:<32}", format!("time, ACLs on / off ({})", a.mount));
            for i in 0..STEPS.len() {
                let _ = write!(o, " {:>7.2}x", a.seconds[i] / b.seconds[i]);
            }
            let _ = writeln!(o);
        }
    }
    o
}

fn raw(runs: &[Run], files: u64) -> Value {
    let rows: Vec<Value> = runs
        .iter()
        .map(|r| {
            json!({"label": r.label, "seconds": STEPS.iter().zip(r.seconds).map(|(s, v)| (s.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "getxattr_getattr": r.requests.map(|q| q.to_vec())})
        })
        .collect();
    json!({"files": files, "runs": rows})
}
