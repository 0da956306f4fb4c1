//! Large directories through the mount (seed 002): readdir in inode order, telldir/seekdir,
//! listings while another thread changes the directory, and readdir+stat served without a
//! lookup per entry.
mod common;
use common::*;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirEntryExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

fn make_files(dir: &Path, prefix: &str, n: usize) -> HashMap<Vec<u8>, u64> {
    std::fs::create_dir_all(dir).expect("mkdir");
    (0..n)
        .map(|i| {
            let name = format!("{prefix}{i:05}");
            let p = dir.join(&name);
            std::fs::File::create(&p).expect("create");
            let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).expect("stat"));
            (name.into_bytes(), ino)
        })
        .collect()
}

/// (name, d_ino, telldir position before the entry) through libc's opendir/readdir.
fn libc_listing(dir: &Path) -> Vec<(Vec<u8>, u64, libc::c_long)> {
    let c = CString::new(dir.as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid path; the stream is closed below; entries are copied before the next call.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null(), "opendir");
        let mut out = Vec::new();
        loop {
            let pos = libc::telldir(d);
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            let name = CStr::from_ptr((*e).d_name.as_ptr()).to_bytes().to_vec();
            out.push((name, (*e).d_ino, pos));
        }
        libc::closedir(d);
        out
    }
}

#[test]
fn readdir_is_in_inode_order_and_seekdir_returns_to_any_position() {
    let m = Mounted::new("256M", "");
    let d = m.path("d");
    let model = make_files(&d, "f", 3000);
    let all = libc_listing(&d);
    let names: Vec<&(Vec<u8>, u64, libc::c_long)> =
        all.iter().filter(|e| e.0 != b"." && e.0 != b"..").collect();
    assert_eq!(names.len(), model.len(), "every entry once");
    for (n, ino, _) in &names {
        assert_eq!(model.get(n), Some(ino), "d_ino is the inode stat returns");
    }
    assert!(
        names.windows(2).all(|w| w[0].1 < w[1].1),
        "entries come in increasing inode order"
    );
    // seekdir to positions taken by telldir: the listing continues from there, identically.
    let c = CString::new(d.as_os_str().as_bytes()).expect("path");
    for k in [0usize, 1, 2, 57, 1499, 2999, all.len() - 1] {
        // SAFETY: as in libc_listing.
        let rest = unsafe {
            let dp = libc::opendir(c.as_ptr());
            assert!(!dp.is_null());
            // read a while, so the stream has buffered state to throw away
            for _ in 0..(k * 7 + 3) % all.len() {
                libc::readdir(dp);
            }
            libc::seekdir(dp, all[k].2);
            let mut rest = Vec::new();
            loop {
                let e = libc::readdir(dp);
                if e.is_null() {
                    break;
                }
                rest.push(CStr::from_ptr((*e).d_name.as_ptr()).to_bytes().to_vec());
            }
            libc::closedir(dp);
            rest
        };
        let want: Vec<Vec<u8>> = all[k..].iter().map(|e| e.0.clone()).collect();
        assert_eq!(rest, want, "seekdir to entry {k}");
    }
}

#[test]
fn listings_while_another_thread_changes_the_directory() {
    let m = Mounted::new("256M", "");
    let d = m.path("d");
    let stable = make_files(&d, "stable", 3000);
    let stop = AtomicBool::new(false);
    let made = std::sync::Mutex::new(HashSet::<(Vec<u8>, u64)>::new());
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut steps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let a = d.join(format!("v{}", x % 300));
                let b = d.join(format!("v{}", (x >> 20) % 300));
                let mut g = made.lock().expect("lock");
                match x % 4 {
                    0 | 1 => {
                        if std::fs::File::create_new(&a).is_ok() {
                            let st = std::fs::metadata(&a).expect("stat new");
                            let ino = std::os::unix::fs::MetadataExt::ino(&st);
                            g.insert((a.file_name().expect("name").as_bytes().to_vec(), ino));
                        }
                    }
                    2 => {
                        let _ = std::fs::remove_file(&a);
                    }
                    _ => {
                        if let Ok(st) = std::fs::metadata(&a) {
                            if std::fs::rename(&a, &b).is_ok() {
                                let ino = std::os::unix::fs::MetadataExt::ino(&st);
                                g.insert((b.file_name().expect("name").as_bytes().to_vec(), ino));
                            }
                        }
                    }
                }
                drop(g);
                steps += 1;
            }
            steps
        });
        for round in 0..25 {
            let mut pairs = HashSet::new();
            let mut stable_seen = 0;
            for e in std::fs::read_dir(&d).expect("read_dir") {
                let e = e.expect("entry");
                let name = e.file_name().as_bytes().to_vec();
                assert!(
                    pairs.insert((name.clone(), e.ino())),
                    "round {round}: {:?} listed twice",
                    e.file_name()
                );
                if let Some(ino) = stable.get(&name) {
                    assert_eq!(*ino, e.ino());
                    stable_seen += 1;
                } else {
                    let g = made.lock().expect("lock");
                    assert!(
                        g.contains(&(name.clone(), e.ino())),
                        "round {round}: {:?} never existed",
                        e.file_name()
                    );
                }
            }
            assert_eq!(
                stable_seen,
                stable.len(),
                "round {round}: every stable entry exactly once"
            );
        }
        stop.store(true, Ordering::Relaxed);
        assert!(writer.join().expect("writer") > 0);
    });
}

#[test]
fn readdir_plus_stat_needs_no_lookup_per_entry() {
    let mut m = Mounted::new("256M", "");
    let d = m.path("d");
    let model = make_files(&d, "f", 2000);
    m.unmount();
    m.counters = true;
    m.mount("");
    // What `ls -l`, `find -ls`, `tar` and `cp -a` do first: list, then lstat every entry.
    let mut n = 0;
    for e in std::fs::read_dir(&d).expect("read_dir") {
        let e = e.expect("entry");
        let st = e.metadata().expect("lstat");
        assert_eq!(
            model.get(e.file_name().as_bytes()),
            Some(&std::os::unix::fs::MetadataExt::ino(&st))
        );
        n += 1;
    }
    assert_eq!(n, model.len());
    let err = m.unmount();
    let count = |op: &str| -> u64 {
        err.lines()
            .find_map(|l| l.strip_prefix(&format!("fuse requests {op}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let (lookups, plus) = (count("lookup"), count("readdirplus"));
    assert!(plus > 0, "listed with readdirplus:\n{err}");
    assert!(
        lookups < 10,
        "{lookups} lookups for {n} lstat calls: attributes should come with the names\n{err}"
    );
    assert!(
        plus < n as u64 / 50,
        "{plus} readdirplus requests for {n} entries: each should carry many"
    );
    m.assert_fsck_clean();
}
