//! `idxfs snapshot MOUNT ...` and `idxfs subvolume MOUNT ...` on a mounted file system: the
//! server makes, deletes or lists read-only snapshots (`idxfs_engine::Fs::snapshot`) and
//! writable subvolumes (`Fs::make_clone` from a snapshot, `Fs::writable_snapshot` of the tree
//! it serves, `Fs::make_subvolume` empty) when asked through an ioctl on the mount's root, as for a trim (`trim`): only root and the
//! mount's owner may ask. A snapshot made so is one point in time beside the mount's other
//! callers: the engine makes it under its lock after a commit, with no write in flight. A
//! deleted one gives its blocks back in the background (the commit thread's drop steps). A
//! writable subvolume made so is parked: the mount goes on serving its own tree and serves
//! the new one writable beside it in its snapshots directory (`snapdir`), and a later mount
//! of the image with `-o subvol=ID` serves it by itself.
//!
//! The argument, `ARG_SIZE` bytes each way: in, `op` u8 (`MAKE`, `DELETE`, `LIST`, `CLONE`,
//! `CREATE`, `SUBVOLUMES`, `WRITABLE`), the name's length u8, 6 zero bytes, an id u64
//! (little-endian: the snapshot to delete, or a clone's origin), the name; out, for `MAKE`,
//! `CLONE`, `CREATE` and `WRITABLE` the new id u64, the length u8 and name of the mount's
//! snapshots directory (`snapdir`, where a snapshot shows read-only and a subvolume
//! writable; 0: not shown), for `LIST` a
//! count u32 and a `more` u8 (entries left out for room), then each entry: id u64,
//! generation u64, source u64 (the tree it was taken of; 0: not recorded), dropping u8, the
//! name's length u8, the name; for `SUBVOLUMES` the same count and `more`, then each entry:
//! id u64, origin u64 (0: none), snapshot_of u64 (a writable snapshot's tree; 0: none),
//! active u8, the name's length u8, the name.
use std::io;
use std::path::Path;

pub const ARG_SIZE: usize = 4096;
/// `_IOWR(0xD7, 4, [u8; ARG_SIZE])`.
pub const IOC_SNAPSHOT: u32 = (3 << 30) | ((ARG_SIZE as u32) << 16) | (0xD7 << 8) | 4;

pub const MAKE: u8 = 1;
pub const DELETE: u8 = 2;
pub const LIST: u8 = 3;
pub const CLONE: u8 = 4;
pub const CREATE: u8 = 5;
pub const SUBVOLUMES: u8 = 6;
pub const WRITABLE: u8 = 7;
const HEADER: usize = 16;

/// What a caller asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    Make(Vec<u8>),
    Delete(u64),
    List,
    /// A writable subvolume named .1 from snapshot .0.
    Clone(u64, Vec<u8>),
    /// An empty writable subvolume.
    Create(Vec<u8>),
    Subvolumes,
    /// A writable snapshot of the tree the mount serves (`Fs::writable_snapshot`).
    Writable(Vec<u8>),
}

/// A writable subvolume as the server lists it: the engine's own description.
pub use idxfs_engine::fs::SubvolumeInfo as Subvolume;

/// A snapshot as the server lists it: the engine's own description.
pub use idxfs_engine::fs::SnapshotInfo as Listed;

pub fn encode(ask: &Ask) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; ARG_SIZE];
    let (op, id, name): (u8, u64, &[u8]) = match ask {
        Ask::Make(name) => (MAKE, 0, name),
        Ask::Delete(id) => (DELETE, *id, &[]),
        Ask::List => (LIST, 0, &[]),
        Ask::Clone(origin, name) => (CLONE, *origin, name),
        Ask::Create(name) => (CREATE, 0, name),
        Ask::Subvolumes => (SUBVOLUMES, 0, &[]),
        Ask::Writable(name) => (WRITABLE, 0, name),
    };
    buf[0] = op;
    buf[1] = u8::try_from(name.len()).ok()?;
    buf[8..16].copy_from_slice(&id.to_le_bytes());
    buf.get_mut(HEADER..HEADER + name.len())?
        .copy_from_slice(name);
    Some(buf)
}

/// The server's side of `encode`; None for a request no server could take.
pub fn decode(buf: &[u8]) -> Option<Ask> {
    let (&op, rest) = buf.split_first()?;
    let len = *rest.first()? as usize;
    let id = u64::from_le_bytes(buf.get(8..16)?.try_into().ok()?);
    let name = || Some(buf.get(HEADER..HEADER + len)?.to_vec());
    match op {
        MAKE => Some(Ask::Make(name()?)),
        DELETE => Some(Ask::Delete(id)),
        LIST => Some(Ask::List),
        CLONE => Some(Ask::Clone(id, name()?)),
        CREATE => Some(Ask::Create(name()?)),
        SUBVOLUMES => Some(Ask::Subvolumes),
        WRITABLE => Some(Ask::Writable(name()?)),
        _ => None,
    }
}

/// One entry of a list reply: three numbers, a flag and a name.
type Entry<'a> = ([u64; 3], u8, &'a [u8]);
/// An entry's bytes before its name: three u64s, the flag, the name's length.
const ENTRY_HEAD: usize = 26;

/// Entries of a list reply, as many as fit after the count and `more`.
fn encode_entries<'a>(all: impl Iterator<Item = Entry<'a>>) -> Vec<u8> {
    let mut out = vec![0u8; 5];
    let mut n = 0u32;
    for (nums, flag, name) in all {
        let name = &name[..name.len().min(255)];
        if out.len() + ENTRY_HEAD + name.len() > ARG_SIZE {
            out[4] = 1;
            break;
        }
        for x in nums {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.push(flag);
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        n += 1;
    }
    out[..4].copy_from_slice(&n.to_le_bytes());
    out
}

#[allow(clippy::type_complexity)]
fn decode_entries(buf: &[u8]) -> Option<(Vec<([u64; 3], u8, Vec<u8>)>, bool)> {
    let n = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?);
    let more = *buf.get(4)? != 0;
    let mut at = 5;
    let mut out = Vec::new();
    for _ in 0..n {
        let mut nums = [0u64; 3];
        for (i, x) in nums.iter_mut().enumerate() {
            *x = u64::from_le_bytes(buf.get(at + 8 * i..at + 8 * i + 8)?.try_into().ok()?);
        }
        let flag = *buf.get(at + 24)?;
        let len = *buf.get(at + 25)? as usize;
        let name = buf.get(at + ENTRY_HEAD..at + ENTRY_HEAD + len)?.to_vec();
        at += ENTRY_HEAD + len;
        out.push((nums, flag, name));
    }
    Some((out, more))
}

/// The reply to a `LIST`: as many entries as fit, and whether some did not.
pub fn encode_list(all: &[Listed]) -> Vec<u8> {
    encode_entries(all.iter().map(|s| {
        (
            [s.id, s.generation, s.source.unwrap_or(0)],
            u8::from(s.dropping),
            &s.name[..],
        )
    }))
}

fn decode_list(buf: &[u8]) -> Option<(Vec<Listed>, bool)> {
    let (entries, more) = decode_entries(buf)?;
    let list = entries
        .into_iter()
        .map(|([id, generation, source], dropping, name)| Listed {
            id,
            generation,
            dropping: dropping != 0,
            source: (source != 0).then_some(source),
            name,
        });
    Some((list.collect(), more))
}

/// The reply to a `SUBVOLUMES`: as many entries as fit, and whether some did not.
pub fn encode_subvolumes(all: &[Subvolume]) -> Vec<u8> {
    encode_entries(all.iter().map(|s| {
        let origin = s.origin.unwrap_or(0);
        let of = s.snapshot_of.unwrap_or(0);
        ([s.id, origin, of], u8::from(s.active), &s.name[..])
    }))
}

fn decode_subvolumes(buf: &[u8]) -> Option<(Vec<Subvolume>, bool)> {
    let (entries, more) = decode_entries(buf)?;
    let list = entries
        .into_iter()
        .map(|([id, origin, of], active, name)| Subvolume {
            id,
            origin: (origin != 0).then_some(origin),
            snapshot_of: (of != 0).then_some(of),
            active: active != 0,
            name,
        });
    Some((list.collect(), more))
}

/// The reply to a `MAKE`: the new id, and the name of the directory of the mount's root
/// that shows it (None: not shown).
pub fn encode_made(id: u64, snapdir: Option<&[u8]>) -> Vec<u8> {
    let mut out = id.to_le_bytes().to_vec();
    let dir = snapdir.unwrap_or_default();
    out.push(dir.len().min(255) as u8);
    out.extend_from_slice(&dir[..dir.len().min(255)]);
    out
}

fn decode_made(buf: &[u8]) -> Option<(u64, Option<Vec<u8>>)> {
    let id = u64::from_le_bytes(buf.get(..8)?.try_into().ok()?);
    let len = *buf.get(8)? as usize;
    let dir = buf.get(9..9 + len)?;
    Some((id, (len > 0).then(|| dir.to_vec())))
}

/// What the server answered.
#[derive(Debug)]
pub enum Answer {
    /// The new id, and the mount's snapshots directory that shows it.
    Made(u64, Option<Vec<u8>>),
    Deleted,
    List(Vec<Listed>, bool),
    Subvolumes(Vec<Subvolume>, bool),
}

/// Asks the server of the idxfs mount at `mp`. An error with an errno is the server's (or
/// the kernel's) answer; any other is worded already, `mp` named.
pub fn request(mp: &Path, ask: &Ask) -> io::Result<Answer> {
    let m = mp.display();
    let mut buf = encode(ask)
        .ok_or_else(|| io::Error::other(format!("{m}: a snapshot name of 1 to 255 bytes")))?;
    crate::root_ioctl::send(mp, IOC_SNAPSHOT, &mut buf, "snapshot")?;
    let bad = || io::Error::other(format!("{m}: the server's answer could not be read"));
    Ok(match ask {
        Ask::Make(_) | Ask::Clone(..) | Ask::Create(_) | Ask::Writable(_) => {
            let (id, dir) = decode_made(&buf).ok_or_else(bad)?;
            Answer::Made(id, dir)
        }
        Ask::Subvolumes => {
            let (l, more) = decode_subvolumes(&buf).ok_or_else(bad)?;
            Answer::Subvolumes(l, more)
        }
        Ask::Delete(_) => Answer::Deleted,
        Ask::List => {
            let (l, more) = decode_list(&buf).ok_or_else(bad)?;
            Answer::List(l, more)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_lists_round_trip() {
        for ask in [
            Ask::Make(b"nightly".to_vec()),
            Ask::Delete(257),
            Ask::List,
            Ask::Clone(300, b"work".to_vec()),
            Ask::Create(b"scratch".to_vec()),
            Ask::Writable(b"work".to_vec()),
            Ask::Subvolumes,
        ] {
            assert_eq!(decode(&encode(&ask).expect("encode")), Some(ask));
        }
        assert_eq!(encode(&Ask::Create(vec![b'a'; 256])), None);
        let subs: Vec<Subvolume> = (0..3)
            .map(|i| Subvolume {
                id: 5 + i,
                origin: (i >= 1).then_some(256 + i),
                snapshot_of: (i == 2).then_some(5),
                active: i == 2,
                name: if i == 0 { Vec::new() } else { vec![b's'; 3] },
            })
            .collect();
        let mut buf = encode_subvolumes(&subs);
        buf.resize(ARG_SIZE, 0);
        assert_eq!(decode_subvolumes(&buf), Some((subs, false)));
        assert_eq!(encode(&Ask::Make(vec![b'a'; 256])), None);
        assert_eq!(decode(&[9; 16]), None);
        for dir in [None, Some(&b".snapshots"[..])] {
            let mut buf = encode_made(300, dir);
            buf.resize(ARG_SIZE, 0);
            assert_eq!(decode_made(&buf), Some((300, dir.map(<[u8]>::to_vec))));
        }
        let all: Vec<Listed> = (0..300)
            .map(|i| Listed {
                id: 256 + i,
                generation: i,
                dropping: i % 2 == 0,
                source: [None, Some(5), Some(256 + i / 2)][i as usize % 3],
                name: vec![b'n'; 40],
            })
            .collect();
        let mut buf = encode_list(&all);
        buf.resize(ARG_SIZE, 0);
        let (got, more) = decode_list(&buf).expect("decode");
        assert!(more && !got.is_empty() && got.len() < all.len());
        assert_eq!(got[..], all[..got.len()]);
    }
}
