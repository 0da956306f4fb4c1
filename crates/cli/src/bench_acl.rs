//! `idxfs bench acl`: what POSIX ACLs cost on the huge-dir workload's directory of empty
//! files, in one run: idxfs mounted `allow_other` (where ACLs are on by default, and the
//! kernel checks permissions with or without them) with ACLs and with `-o noacl`, beside the
//! run's other file systems (ACLs on: their default). Steps, each with cold caches: create the files, `ls -l`, `cp -a`
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

/// One configuration's results: seconds per step, and for idxfs (GETXATTR, GETATTR) per step.
struct Run {
    label: &'static str,
    seconds: [f64; 3],
    requests: Option<[(u64, u64); 3]>,
}

fn count(report: &str, op: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.strip_prefix(&format!("fuse requests {op}: ")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn on(t: &mut Target, files: u64) -> Result<([f64; 3], [(u64, u64); 3]), String> {
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
        asked[i] = (count(&report, "getxattr"), count(&report, "getattr"));
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
        runs.push(("idxfs (ACLs on)", FsKind::Idxfs, Some("allow_other")));
        runs.push(("idxfs -o noacl", FsKind::Idxfs, Some("allow_other,noacl")));
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
        "acl: {files} empty files in one directory, seconds (cold caches before each step)"
    );
    let _ = write!(o, "{:<20}", "step");
    for r in runs {
        let _ = write!(o, " {:>16}", r.label);
    }
    let _ = writeln!(o, " {:>10}", "on / off");
    for (i, step) in STEPS.iter().enumerate() {
        let _ = write!(o, "{step:<20}");
        for r in runs {
            let _ = write!(o, " {:>16.2}", r.seconds[i]);
        }
        match (runs.first(), runs.get(1)) {
            (Some(on), Some(off)) if off.requests.is_some() => {
                let _ = writeln!(o, " {:>9.2}x", on.seconds[i] / off.seconds[i]);
            }
            _ => {
                let _ = writeln!(o, " {:>10}", "-");
            }
        }
    }
    let _ = writeln!(
        o,
        "requests per file the idxfs daemon got (GETXATTR, GETATTR):"
    );
    for (i, step) in STEPS.iter().enumerate() {
        let _ = write!(o, "{step:<20}");
        for r in runs {
            let _ = match r.requests {
                Some(q) => write!(
                    o,
                    " {:>16}",
                    format!(
                        "{:.2}, {:.2}",
                        q[i].0 as f64 / files as f64,
                        q[i].1 as f64 / files as f64
                    )
                ),
                None => write!(o, " {:>16}", "-"),
            };
        }
        let _ = writeln!(o);
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
