//! The benchmark harness itself (not performance): `idxfs bench --scale test --fs tmpfs` runs
//! the smallest scale of every workload against tmpfs only, writes its tables, JSON and plots,
//! and leaves nothing mounted, on /dev/shm, or in its working directory.
mod common;
use common::*;
use std::collections::HashSet;

/// Mount points of benchmark scratch directories (another benchmark may run beside the test).
fn bench_mounts() -> HashSet<String> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(1).map(str::to_string))
        .filter(|m| m.contains("/idxb"))
        .collect()
}

fn shm_entries() -> HashSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("idxb"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_workload_runs_against_tmpfs_and_cleans_up() {
    let out = tempfile::tempdir().expect("tempdir");
    let before = shm_entries();
    let mounted_before = bench_mounts();
    // Run from an empty directory: nothing may land in the caller's working directory
    // either (fs_mark writes its fs_log.txt there unless told otherwise).
    let cwd = tempfile::tempdir().expect("tempdir");
    let run = std::process::Command::new(bin())
        .current_dir(cwd.path())
        .args(["bench", "--scale", "test", "--fs", "tmpfs", "--out"])
        .arg(out.path())
        .output()
        .expect("run idxfs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(
        run.status.success(),
        "idxfs bench failed:\n{stdout}\n{stderr}"
    );
    let litter: Vec<_> = std::fs::read_dir(cwd.path())
        .expect("read cwd")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        litter.is_empty(),
        "left in the working directory: {litter:?}"
    );
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("bench.json")).expect("bench.json"),
    )
    .expect("valid JSON");
    for w in [
        "fs_mark",
        "dir-fsync",
        "huge-dir",
        "nocow-write",
        "apps",
        "acl",
        "micro",
    ] {
        assert!(
            json["workloads"][w].is_object(),
            "{w} missing from bench.json"
        );
        let table = std::fs::read_to_string(out.path().join(format!("{w}.txt")))
            .unwrap_or_else(|e| panic!("{w}.txt: {e}"));
        // huge-dir has a row per step and a column per file system; the others a row per fs.
        let has_tmpfs = match w {
            "micro" => true,
            "huge-dir" => table.lines().nth(1).is_some_and(|h| h.contains("tmpfs")),
            _ => table.lines().any(|l| l.starts_with("tmpfs")),
        };
        assert!(has_tmpfs, "{w} table has no tmpfs entry:\n{table}");
    }
    assert!(json["machine"]["kernel"].is_string());
    let fsync = &json["workloads"]["dir-fsync"]["results"][0];
    assert_eq!(fsync["count"], 20, "2000 files, an fsync every 100");
    let hd = json["workloads"]["huge-dir"]["samples"]
        .as_array()
        .expect("samples");
    assert_eq!(hd.len(), 12, "6 steps, fresh and aged");
    assert!(json["workloads"]["nocow-write"]["results"][0]["mib_per_sec"].as_f64() > Some(0.0));
    let micro = std::fs::read_to_string(out.path().join("micro.txt")).expect("micro.txt");
    assert!(
        micro.contains("seed 000") || micro.contains("skipped"),
        "{micro}"
    );
    for png in [
        "fs_mark.png",
        "dir-fsync-histogram.png",
        "dir-fsync-series.png",
        "huge-dir-fresh.png",
        "huge-dir-aged.png",
        "nocow-write.png",
    ] {
        let len = std::fs::metadata(out.path().join(png))
            .unwrap_or_else(|e| panic!("{png}: {e}"))
            .len();
        assert!(len > 1000, "{png} is {len} bytes");
    }
    let mounted = bench_mounts();
    assert!(
        mounted.is_subset(&mounted_before),
        "left mounted: {:?}",
        mounted.difference(&mounted_before)
    );
    let after = shm_entries();
    assert!(
        after.is_subset(&before),
        "left on /dev/shm: {:?}",
        after.difference(&before)
    );
}

#[test]
fn bad_arguments_get_one_line_errors() {
    let (code, _, err) = idxfs(&[
        "bench",
        "no-such-workload",
        "--scale",
        "test",
        "--fs",
        "tmpfs",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown workload"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let (code, _, err) = idxfs(&["bench", "--fs", "ntfs", "--scale", "test"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown file system"), "{err}");
}
