//! `idxfs bench apps`: what applications do, timed on each file system of the run and on
//! idxfs with the kernel's writeback cache (`-o writeback`), the setting these numbers are
//! for deciding:
//! - sqlite (Python's sqlite3): rows inserted in transactions of 1,000, each committed
//!   (fsync), in WAL mode and with the rollback journal;
//! - git: `git clone` of a repository made on the spot (over file://, so objects are copied,
//!   not linked), `git checkout` of a branch that changes a tenth of its files, `git status`;
//! - untar of the same source tree.
//!
//! The tree, the repository and the tarball are made once on /dev/shm outside every file
//! system under test, so each run starts from the same bytes. Every file system runs twice,
//! in turn, after a warm-up write to /dev/shm, and each step keeps its best (`ROUNDS`).
use crate::bench_env::{self, run, FsKind, Target};
use crate::bench_suite::{ratio_table, Row, Scale};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Rounds over every file system; each step keeps its best.
const ROUNDS: usize = 2;

/// The inserting program: `python3 - DB ROWS JOURNAL_MODE`.
const SQLITE: &str = r#"
import sqlite3, sys
db, rows, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = sqlite3.connect(db, isolation_level=None)
c.execute("PRAGMA journal_mode=" + mode)
c.execute("PRAGMA synchronous=FULL")
c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, body BLOB)")
for start in range(0, rows, 1000):
    c.execute("BEGIN")
    c.executemany("INSERT INTO t (name, body) VALUES (?, ?)",
                  ((f"row {i}", bytes(100)) for i in range(start, min(rows, start + 1000))))
    c.execute("COMMIT")
assert c.execute("SELECT count(*) FROM t").fetchone()[0] == rows
c.close()
"#;

/// Seconds `cmd` took; its failure is the benchmark's.
fn timed(cmd: &mut Command) -> Result<f64, String> {
    let t = Instant::now();
    run(cmd)?;
    Ok(t.elapsed().as_secs_f64())
}

fn git(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("-C").arg(dir).args([
        "-c",
        "user.name=bench",
        "-c",
        "user.email=bench@idxfs",
        "-c",
        "init.defaultBranch=main",
    ]);
    c
}

/// The source tree (`files` small text files, 50 to a directory), a git repository of it
/// with a second branch that changes every tenth file, and a tarball of it, under `base`.
fn sources(base: &Path, files: u64) -> Result<(), String> {
    let tree = base.join("apps-src");
    for i in 0..files {
        let dir = tree.join(format!("d{:03}", i / 50));
        if i % 50 == 0 {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let body = format!("// file {i}\n").repeat(1 + (i % 8) as usize * 40);
        let p = dir.join(format!("f{i}.c"));
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    run(git(&tree).arg("init").arg("-q"))?;
    run(git(&tree).args(["add", "-A"]))?;
    run(git(&tree).args(["commit", "-q", "-m", "base"]))?;
    run(git(&tree).args(["checkout", "-q", "-b", "other"]))?;
    for i in (0..files).step_by(10) {
        let p = tree.join(format!("d{:03}/f{i}.c", i / 50));
        std::fs::write(&p, format!("// changed {i}\n")).map_err(|e| format!("{e}"))?;
    }
    run(git(&tree).args(["commit", "-q", "-a", "-m", "other"]))?;
    run(git(&tree).args(["checkout", "-q", "main"]))?;
    run(Command::new("tar")
        .arg("-cf")
        .arg(base.join("apps-src.tar"))
        .arg("-C")
        .arg(base)
        .arg("apps-src"))?;
    Ok(())
}

/// Step `i` of the four (sqlite WAL, sqlite rollback journal, git, untar) on the file system
/// mounted at `mp`; its seconds.
fn step(i: usize, mp: &Path, base: &Path, rows: u64) -> Result<f64, String> {
    match i {
        0 | 1 => {
            let mode = if i == 0 { "wal" } else { "delete" };
            let db = mp.join(format!("{mode}.db"));
            let mut py = Command::new("python3");
            py.arg("-c")
                .arg(SQLITE)
                .arg(&db)
                .arg(rows.to_string())
                .arg(mode);
            timed(&mut py)
        }
        2 => {
            let clone = mp.join("clone");
            let src = format!("file://{}", base.join("apps-src").display());
            let g = Instant::now();
            run(Command::new("git").args(["clone", "-q", &src]).arg(&clone))?;
            run(git(&clone).args(["checkout", "-q", "other"]))?;
            run(git(&clone).args(["status", "--porcelain"]))?;
            Ok(g.elapsed().as_secs_f64())
        }
        _ => {
            let untar = mp.join("untar");
            std::fs::create_dir(&untar).map_err(|e| format!("{}: {e}", untar.display()))?;
            timed(
                Command::new("tar")
                    .arg("-xf")
                    .arg(base.join("apps-src.tar"))
                    .arg("-C")
                    .arg(&untar),
            )
        }
    }
}

/// The four timings on one mounted file system, in seconds.
fn on(t: &Target, base: &Path, rows: u64) -> Result<[f64; 4], String> {
    let mut out = [0.0; 4];
    for (i, o) in out.iter_mut().enumerate() {
        *o = step(i, &t.mp, base, rows)?;
    }
    Ok(out)
}

/// The FUSE floor of each step: an idxfs run (not timed) whose daemon counts its requests,
/// restarted after each step for the count; the requests the kernel waits on, times one round
/// trip (`bench_mount::floor_ns`), in seconds.
fn floors(base: &Path, bytes: u64, rows: u64) -> Result<[(u64, f64); 4], String> {
    let rt = crate::bench_mount::floor_ns(base)? / 1e9;
    let mut t = Target::make_counted(base, FsKind::Idxfs, bytes, 1 << 20, None)?;
    // Counting starts after the test bed's own setup of the mount.
    t.cold_report()?;
    let mut out = [(0, 0.0); 4];
    for (i, o) in out.iter_mut().enumerate() {
        step(i, &t.mp, base, rows)?;
        let n = bench_env::round_trips(&t.cold_report()?);
        if n == 0 {
            // Every step makes files: no count means the daemon's report never came.
            return Err(format!(
                "apps step {i}: the idxfs daemon reported no requests"
            ));
        }
        *o = (n, n as f64 * rt);
    }
    Ok(out)
}

/// The workload: a table per application, a row per file system, and the raw seconds.
pub fn apps(scale: Scale, fs: &[FsKind], base: &Path) -> Result<(String, Value), String> {
    bench_env::ensure_tools(&[("git", "git"), ("python3", "python3")])?;
    let files = scale.pick(200u64, 3_000, 20_000);
    let rows = scale.pick(3_000u64, 100_000, 300_000);
    sources(base, files)?;
    // (label, kind, idxfs mount options)
    let mut runs: Vec<(String, FsKind, Option<&str>)> = Vec::new();
    for &k in fs {
        runs.push((k.name().to_string(), k, None));
        if k == FsKind::Idxfs {
            runs.push(("idxfs -o writeback".into(), k, Some("writeback")));
        }
    }
    let bytes = scale.pick(2 << 30, 8 << 30, 16 << 30);
    // Whoever runs first on fresh /dev/shm pages pays for touching them (`warm_up`); and
    // which one runs first in a round still moves the numbers here, so every file system
    // runs twice, in turn, and each step keeps its best (as `bench data` does).
    bench_env::warm_up(base, scale.pick(256 << 20, 2 << 30, 4 << 30))?;
    // Per run: the best seconds per step, and the lower CPU seconds of its whole runs.
    let mut best: Vec<([f64; 4], f64)> = vec![([f64::INFINITY; 4], f64::INFINITY); runs.len()];
    for round in 0..ROUNDS {
        for (k, (label, kind, opts)) in runs.iter().enumerate() {
            bench_env::interrupted()?;
            eprintln!("  apps on {label}, round {round}");
            let t = Target::make_with(base, *kind, bytes, 1 << 20, *opts)?;
            let cpu0 = bench_env::self_and_children_cpu();
            let secs = on(&t, base, rows)?;
            let cpu = bench_env::self_and_children_cpu() - cpu0
                + t.daemon_pid().map(bench_env::process_cpu).unwrap_or(0.0);
            let (b, c) = &mut best[k];
            for (b, s) in b.iter_mut().zip(secs) {
                *b = b.min(s);
            }
            *c = c.min(cpu);
        }
    }
    let mut rows_of: [Vec<Row>; 4] = Default::default();
    let mut raw = serde_json::Map::new();
    for ((label, kind, _), (secs, cpu)) in runs.into_iter().zip(best) {
        for (i, s) in secs.iter().enumerate() {
            rows_of[i].push((label.clone(), kind, s * 1e3, cpu, 0.0));
        }
        raw.insert(
            label,
            json!({"sqlite_wal_s": secs[0], "sqlite_journal_s": secs[1],
            "git_s": secs[2], "untar_s": secs[3], "cpu_s": cpu}),
        );
    }
    let titles = [
        format!("apps: sqlite, {rows} rows in commits of 1,000, WAL"),
        format!("apps: sqlite, {rows} rows in commits of 1,000, rollback journal"),
        format!("apps: git clone + checkout (a tenth of {files} files) + status"),
        format!("apps: untar of {files} files"),
    ];
    let mut table = String::new();
    for (title, rows) in titles.iter().zip(&rows_of) {
        table.push_str(&ratio_table(title, "ms", rows, false));
        table.push('\n');
    }
    table.push_str(&format!(
        "(best of {ROUNDS} rounds after a warm-up write; CPU-s: the whole application run on that \
         file system, daemon included, the lower of its rounds)\n"
    ));
    let mut floor_raw = Value::Null;
    if fs.contains(&FsKind::Idxfs) {
        eprintln!("  apps on idxfs, counting requests");
        let f = floors(base, bytes, rows)?;
        table.push_str(
            "FUSE floor on idxfs (requests the kernel waited on, times one round trip; a \
             separate run):",
        );
        for ((n, secs), name) in f.iter().zip(["sqlite WAL", "rollback", "git", "untar"]) {
            table.push_str(&format!(" {name} {n} -> {:.0} ms;", secs * 1e3));
        }
        table.push('\n');
        floor_raw = json!(f
            .iter()
            .map(|(n, secs)| json!({"requests": n, "floor_s": secs}))
            .collect::<Vec<_>>());
    }
    Ok((
        table,
        json!({"files": files, "rows": rows, "runs": raw, "fuse_floor": floor_raw}),
    ))
}
