//! pjdfstest (the POSIX conformance suite) against an idxfs mount: zero failures, apart from the
//! ones listed with a reason in tests/pjdfstest/EXCLUDED.md (currently none).
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn pjdfstest_bin() -> PathBuf {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("pjdfstest"))
                .collect()
        })
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("CARGO_HOME")
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo").into_os_string()))
    {
        candidates.push(Path::new(&home).join("bin").join("pjdfstest"));
    }
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("pjdfstest not found: run `cargo install pjdfstest --version 0.2.2` (README's test command does)")
    })
}

/// Test names listed as excluded: lines of the form "- `name`: reason" under "## Excluded".
fn excluded(doc: &str) -> Vec<String> {
    let Some(start) = doc.find("## Excluded") else {
        return Vec::new();
    };
    let section = &doc[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    section[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn pjdfstest_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/pjdfstest");
    let doc = std::fs::read_to_string(root.join("EXCLUDED.md")).expect("EXCLUDED.md");
    let allowed = excluded(&doc);
    let m = Mounted::new("512M", "");
    let second = shm_tempdir();
    let out = Command::new(pjdfstest_bin())
        .arg("-c")
        .arg(root.join("pjdfstest.toml"))
        .arg("-p")
        .arg(&m.mp)
        .arg("-s")
        .arg(second.path())
        .current_dir(&m.mp)
        .output()
        .expect("run pjdfstest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| panic!("no summary from pjdfstest:\n{stdout}"));
    eprintln!("pjdfstest: {summary}");
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_end().ends_with("FAILED"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let unexpected: Vec<&&str> = failed
        .iter()
        .filter(|f| !allowed.iter().any(|a| a == *f))
        .collect();
    assert!(
        unexpected.is_empty(),
        "pjdfstest failures not in EXCLUDED.md: {unexpected:?}\n{stdout}"
    );
    let passed: u64 = summary
        .split(", ")
        .find_map(|p| p.strip_suffix(" passed"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(passed >= 380, "only {passed} tests passed: {summary}");
    drop(m);
}
