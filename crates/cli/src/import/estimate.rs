//! The size a new image needs for a tree (`mkfs --from` without `--size`): one walk that
//! stats every entry but the directories their listing already names as such, before the
//! copy can start (the image's size is part of its format). Nothing else runs meanwhile, so
//! the walk takes every CPU: a few threads share one stack of directories still to list.
use super::source::{DirPath, Entry};
use std::path::Path;
use std::sync::{Condvar, Mutex};

/// Most threads the walk takes; past a few, listing and stat'ing contend in the kernel.
const THREADS: usize = 4;

/// What the walk has counted.
#[derive(Default, Clone, Copy)]
struct Count {
    /// Data bytes, rounded up to blocks per file.
    data: u64,
    entries: u64,
    /// Bytes of names.
    names: u64,
}

impl Count {
    fn add(&mut self, o: Count) {
        self.data += o.data;
        self.entries += o.entries;
        self.names += o.names;
    }
}

/// Directories still to list, and how many threads are listing one (they may add more).
struct Work {
    todo: Vec<DirPath>,
    busy: usize,
    failed: Option<String>,
}

/// An estimate of the image size `dir` needs: its data rounded to blocks, room for its
/// metadata, and the share idxfs keeps free (the reserves of `fs::reserve`). Returns the
/// size and the entries counted; Err is one line naming the path that failed.
pub(crate) fn estimate(dir: &Path) -> Result<(u64, u64), String> {
    let work = Mutex::new(Work {
        todo: vec![DirPath::new(dir)],
        busy: 0,
        failed: None,
    });
    let moved = Condvar::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(THREADS));
    let mut total = Count::default();
    std::thread::scope(|s| {
        // Helpers the system refuses to start are fewer helpers: the calling thread walks too,
        // so the walk ends with none of them.
        let hs: Vec<_> = (1..threads)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("idxfs-estimate".into())
                    .spawn_scoped(s, || walker(&work, &moved))
                    .ok()
            })
            .collect();
        total.add(walker(&work, &moved));
        for h in hs {
            // A walker that panicked counted nothing more; its failure is reported below.
            match h.join() {
                Ok(c) => total.add(c),
                Err(_) => lock(&work).failed = Some("the size estimate's walk panicked".into()),
            }
        }
    });
    if let Some(why) = lock(&work).failed.take() {
        return Err(why);
    }
    // Per entry: the inode item, an entry in each directory index, a back reference and an
    // extent, with the B+trees' slack (leaves kept from half full), copied on write.
    let meta = total.entries * 1024 + total.names * 4;
    let size = (total.data + meta) / 4 * 5 + (64 << 20);
    Ok((size.div_ceil(1 << 20) << 20, total.entries))
}

fn lock(work: &Mutex<Work>) -> std::sync::MutexGuard<'_, Work> {
    // A walker holds the lock only to move paths, which cannot leave it inconsistent.
    work.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes directories off the stack and lists them until none is left and no other walker
/// can add one (or one failed); returns what it counted.
fn walker(work: &Mutex<Work>, moved: &Condvar) -> Count {
    let mut count = Count::default();
    loop {
        let next = {
            let mut w = lock(work);
            loop {
                if w.failed.is_some() {
                    break None;
                }
                if let Some(d) = w.todo.pop() {
                    w.busy += 1;
                    break Some(d);
                }
                if w.busy == 0 {
                    break None;
                }
                w = moved.wait(w).unwrap_or_else(|p| p.into_inner());
            }
        };
        let Some(d) = next else {
            moved.notify_all();
            return count;
        };
        let mut subdirs = Vec::new();
        let r = list_one(&d, &mut count, &mut subdirs);
        let mut w = lock(work);
        w.busy -= 1;
        w.todo.extend(subdirs);
        if let Err(why) = r {
            w.failed.get_or_insert(why);
        }
        drop(w);
        moved.notify_all();
    }
}

/// Counts the entries of directory `d` into `count` and its subdirectories into `subdirs`.
fn list_one(d: &DirPath, count: &mut Count, subdirs: &mut Vec<DirPath>) -> Result<(), String> {
    let open = d.open().and_then(|h| h.entries().map(|e| (h, e)));
    let (handle, list) = open.map_err(|e| format!("{}: {e}", d.shown().display()))?;
    let failed = |name: &std::ffi::OsStr, e: std::io::Error| {
        format!("{}: {e}", d.shown().join(name).display())
    };
    for Entry { name, dtype } in list {
        count.entries += 1;
        count.names += name.len() as u64;
        if dtype == libc::DT_DIR {
            subdirs.push(d.child(&handle, &name));
            continue;
        }
        let m = handle.stat(&name).map_err(|e| failed(&name, e))?;
        if m.is_dir() {
            subdirs.push(d.child(&handle, &name));
        } else if m.is_file() || m.is_symlink() {
            // Allocated bytes, so holes cost nothing; a file written since may need more.
            count.data += (m.blocks() * 512).min(m.size()).div_ceil(4096) * 4096;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A tree wide and deep enough that the walkers hand directories to each other.
    fn tree(root: &Path) -> (u64, u64) {
        let (mut entries, mut data) = (0u64, 0u64);
        for i in 0..40 {
            let mut d = root.join(format!("top{i}"));
            std::fs::create_dir(&d).expect("mkdir");
            entries += 1;
            for depth in 0..i % 5 {
                d = d.join(format!("sub{depth}"));
                std::fs::create_dir(&d).expect("mkdir");
                entries += 1;
            }
            for f in 0..i {
                let len = (f * 1000) as usize;
                std::fs::write(d.join(format!("f{f}")), vec![7u8; len]).expect("write");
                data += (len as u64).div_ceil(4096) * 4096;
                entries += 1;
            }
            symlink("target", d.join("link")).expect("symlink");
            entries += 1;
            data += 4096;
        }
        (entries, data)
    }

    #[test]
    fn counts_every_entry_and_leaves_room_for_the_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (entries, data) = tree(dir.path());
        for _ in 0..20 {
            let (size, n) = estimate(dir.path()).expect("estimate");
            assert_eq!(n, entries);
            assert!(size >= data + (64 << 20), "{size} for {data} bytes of data");
            assert_eq!(size % (1 << 20), 0);
        }
    }

    #[test]
    fn a_directory_it_cannot_list_is_one_line_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gone = dir.path().join("missing");
        let e = estimate(&gone).expect_err("a missing directory fails");
        assert!(e.starts_with(&gone.display().to_string()), "{e}");
        assert!(!e.contains('\n'), "{e}");
        // A file where a directory should be: the walk names it and stops.
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        let e = estimate(&file).expect_err("a file is not listed");
        assert!(e.starts_with(&file.display().to_string()), "{e}");
    }
}
