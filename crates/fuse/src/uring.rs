//! FUSE over io_uring: a queue per CPU, served by a worker pinned to that CPU.
//!
//! Over /dev/fuse every request is a handoff between two CPUs: the kernel wakes whichever
//! worker has waited longest, wherever it runs, and its reply wakes the caller back on the
//! caller's CPU. On this VM (idle CPUs halt; waking one costs an exit to the hypervisor) that
//! handoff is most of a metadata request's cost: 50,000 creates took 1.8 s with the caller and
//! a single worker forced onto one CPU and 8.9 s with them on different CPUs. With io_uring
//! (Linux 6.14+, `fuse.enable_uring=Y`) the kernel puts a request on the queue of the CPU the
//! caller runs on, so the worker serving that queue, pinned there, takes it without crossing
//! CPUs. The caller itself still moves: woken while the worker holds its CPU, it is placed on
//! the idle one (what `handoff.rs` answers). So the gain measured without the handoff is
//! 1.2-1.7x, not 5x: 20,000 creates 14.2K -> 16K/s,
//! `rm -rf` of 20,000 files 1.2 -> 0.8-1.1 s, `cp -a` of 20,000 files 3.4-4.0 -> 2.1-2.5 s,
//! `idxfs bench` fs_mark 22,900 -> 39,700 files/s (docs/benchmarks.md).
//!
//! The protocol (include/uapi/linux/fuse.h, fs/fuse/dev_uring.c): the server registers ring
//! entries, each a 288-byte header area and a payload buffer, with `IORING_OP_URING_CMD`
//! (128-byte SQEs) on the /dev/fuse fd, at least one per possible CPU before the kernel
//! switches over. A completion means a request sits in the entry: `fuse_in_header` at
//! header[0..40], the operation's fixed argument at header[128..], the rest (names, write
//! data) in the payload. The reply goes back the same way (`fuse_out_header` at header[0..16],
//! the rest in the payload) with `COMMIT_AND_FETCH`, which also waits for the next request.
//! FORGET and INTERRUPT still come through /dev/fuse, so fuser's own workers keep running.
//!
//! Requests are parsed and dispatched by fuser (`Dispatcher`, the patch in vendor/fuser): the
//! header and the fixed argument are copied in front of the payload so the request is one
//! contiguous, aligned buffer, exactly as a read of /dev/fuse returns it.
//!
//! A request that brought no payload (a READ) leaves the entry's payload area free until its
//! reply, so the worker lends the area to the handler for that dispatch (`with_reply_area`):
//! the engine reads the file's blocks straight into it (`Fs::read_into`), and a reply whose
//! body is exactly that slice is committed as it lies (`Capture`). A READ's bytes then go from
//! the device straight into the area, where they went into a zeroed buffer of the engine's
//! and were copied twice more (into the captured reply, then into the area);
//! docs/benchmarks.md has what that saves.
use crate::handoff::{Handoff, Recent};
use crate::IdxFuse;
use fuser::{Dispatcher, ReplySink};
use idxfs_engine::counters::Counter;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The kernel's switch (root may write Y to it; a mount asks for io_uring only when it is Y).
pub const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether this kernel lets FUSE servers use io_uring now.
pub fn kernel_enabled() -> bool {
    std::fs::read_to_string(PARAM).is_ok_and(|s| s.trim() == "Y")
}

/// Turns the kernel's switch on (root only) when this kernel has it; true if it is on after.
/// It only lets servers ask for io_uring: FUSE servers that do not ask are unaffected.
pub fn kernel_enable() -> bool {
    kernel_enabled() || (std::fs::write(PARAM, "Y").is_ok() && kernel_enabled())
}

const CMD_REGISTER: u32 = 1;
/// `IORING_ENTER_GETEVENTS`: with a deferred-taskrun ring, also runs the queued completions.
const GETEVENTS: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: in_out[128], op_in[128], `fuse_uring_ent_in_out` (32).
const HEADER_BYTES: usize = 288;
const OP_IN_AT: usize = 128;
const OP_IN_MAX: usize = 128;
const ENT_IN_OUT_AT: usize = 256;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// Room in front of the payload for the in-header and the largest fixed argument.
const PREFIX: usize = IN_HEADER + OP_IN_MAX;
/// The kernel wants at least max(8 KiB, max_write, max_pages pages): 1 MiB here; twice that
/// leaves room should the kernel round differently. Pages never touched are never backed.
const PAYLOAD: usize = 2 * crate::MAX_WRITE as usize;
/// Ring entries per queue: one in the worker's hands while the next request is filled in,
/// and while threads of their own work out the replies of up to `DEPTH - 1` (`park`), one
/// left to take the CPU's requests.
/// The kernel hands a request to the entry that came back last, so the others cost nothing
/// but their buffers, whose pages are never touched until a request comes in them.
const DEPTH: usize = 4;

const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
const _: () = assert!(PREFIX.is_multiple_of(8) && IN_HEADER.is_multiple_of(8));

/// What the ring workers did, for `IDXFS_COUNTERS`.
#[derive(Default)]
pub struct Stats {
    /// Requests taken from a ring.
    pub requests: Counter,
    /// Requests that could not be parsed or got no reply (answered EIO).
    pub malformed: Counter,
    /// Entries registered again after the kernel refused their commit outside a teardown.
    pub reregistered: Counter,
    /// Workers that were to hand the CPU off with their replies and could not (`handoff.rs`).
    pub no_handoff: Counter,
    /// Requests served at SCHED_IDLE: the next request of the caller a reply handed off to,
    /// there already when the worker ran again (`handoff.rs`).
    pub served_idle: Counter,
    /// Stays at SCHED_IDLE longer than `handoff::STARVED`, each pausing that worker's
    /// handoffs for `handoff::STARVED_PAUSE`: something else wanted its CPU.
    pub starved: Counter,
    /// Replies whose body the handler built in the entry's reply area (`with_reply_area`),
    /// sent without a copy.
    pub in_place: Counter,
    /// Requests whose entry the worker parked while a thread of its own worked out the reply
    /// (`park`, `long.rs`).
    pub parked: Counter,
}

/// What a worker does with an entry whose command failed with `errno`.
#[derive(Debug, PartialEq, Eq)]
enum OnError {
    /// The connection is going away (unmount, abort): the entry is done.
    Done,
    /// Registration came before the kernel finished FUSE_INIT: register again shortly.
    RegisterLater,
    /// A commit refused for another reason: the kernel no longer holds the entry, and a queue
    /// that lost all its entries would leave its CPU's callers waiting until unmount, so hand
    /// the buffers back with a new registration.
    Reregister,
    /// A registration refused: this kernel will not use the entry; requests it would have
    /// carried go through the other entries, or /dev/fuse.
    GiveUp,
}

fn on_error(was_register: bool, errno: i32) -> OnError {
    match errno {
        libc::ENOTCONN | libc::ECANCELED | libc::ECONNABORTED | libc::ENODEV => OnError::Done,
        libc::EAGAIN if was_register => OnError::RegisterLater,
        _ if was_register => OnError::GiveUp,
        _ => OnError::Reregister,
    }
}

/// Possible CPUs (`/sys/devices/system/cpu/possible`, e.g. "0-1" or "0-3,6"): the kernel
/// makes one queue for each, and switches to the ring only when all have an entry.
fn possible_cpus() -> io::Result<Vec<usize>> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(s.trim())
        .ok_or_else(|| io::Error::other(format!("cannot parse possible CPUs {s:?}")))
}

fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// Starts one worker per possible CPU, each with its own ring, registering `DEPTH` entries
/// for its queue on `dev` (a duplicate of the session's /dev/fuse fd). The workers end when
/// the kernel tears the queues down (unmount), with `ENOTCONN` on every entry. Should a worker
/// fail to start, the others are returned and the mount goes on over /dev/fuse: the kernel
/// switches to the rings only once every queue has an entry.
pub(crate) fn start(
    dev: OwnedFd,
    dispatcher: Dispatcher<IdxFuse>,
    stats: Arc<Stats>,
    handoff: bool,
    recent: Arc<Recent>,
) -> Vec<JoinHandle<io::Result<()>>> {
    let dev = Arc::new(dev);
    let allowed = crate::pin::allowed_cpus();
    let mut threads = Vec::new();
    let cpus = match possible_cpus() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("idxfs: FUSE over io_uring not started ({e}); serving /dev/fuse");
            return threads;
        }
    };
    for cpu in cpus {
        let Ok(qid) = u16::try_from(cpu) else {
            eprintln!("idxfs: CPU {cpu} has no io_uring queue number; serving /dev/fuse");
            break;
        };
        let (dev, dispatcher, stats) = (dev.clone(), dispatcher.clone(), stats.clone());
        let recent = recent.clone();
        let pin = allowed.contains(&cpu).then_some(cpu);
        let spawned = std::thread::Builder::new()
            .name(format!("idxfs-uring-{cpu}"))
            .spawn(move || Queue::serve(qid, pin, handoff, &recent, &dev, &dispatcher, &stats));
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                eprintln!("idxfs: io_uring worker for CPU {cpu}: {e}; serving /dev/fuse");
                break;
            }
        }
    }
    threads
}

/// One ring entry's buffers; the kernel writes them while the entry waits for a request.
struct Entry {
    /// `HEADER_BYTES`, as u64 so it is aligned.
    headers: Box<[u64]>,
    /// `PREFIX` bytes, then the payload.
    buf: Box<[u64]>,
    /// {headers, payload}, read by the kernel at registration.
    iov: Box<[libc::iovec; 2]>,
}

impl Entry {
    fn new() -> Entry {
        let mut headers = vec![0u64; HEADER_BYTES / 8].into_boxed_slice();
        let mut buf = vec![0u64; (PREFIX + PAYLOAD) / 8].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: headers.as_mut_ptr().cast(),
                iov_len: HEADER_BYTES,
            },
            libc::iovec {
                // SAFETY: PREFIX is within the buffer (it holds PREFIX + PAYLOAD bytes).
                iov_base: unsafe { buf.as_mut_ptr().cast::<u8>().add(PREFIX) }.cast(),
                iov_len: PAYLOAD,
            },
        ]);
        Entry { headers, buf, iov }
    }
}

fn bytes_of(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: any u64 slice is a valid u8 slice eight times as long, same lifetime.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(a)
}

/// Takes the reply fuser sends for the request in one ring entry: while its handler runs, or
/// later from a thread of its own when the worker parked the entry (`park`).
struct Capture {
    reply: Mutex<Pending>,
    /// The address of the payload area the request's handler was offered, if any: a reply
    /// body that is exactly there is already in place.
    area: AtomicUsize,
    /// The entry's slot in its queue, and the queue's bell, which a reply to a parked entry
    /// rings (None: this queue parks nothing).
    slot: usize,
    bell: Option<Arc<Bell>>,
}

/// Where an entry's reply is.
enum Pending {
    /// Not sent yet, while the handler runs.
    Nothing,
    /// Not sent yet, and the worker went on without it (`park`): the reply rings the bell.
    Parked,
    Sent(Captured),
}

/// A captured reply: its bytes (the `fuse_out_header` first), and when its body was built in
/// the entry's payload area (`with_reply_area`), the body's length instead of a copy.
struct Captured {
    bytes: Vec<u8>,
    in_place: Option<usize>,
}

impl Captured {
    fn body_len(&self) -> usize {
        self.in_place
            .unwrap_or_else(|| self.bytes.len().saturating_sub(OUT_HEADER))
    }
}

impl Capture {
    fn new(slot: usize, bell: Option<Arc<Bell>>) -> Capture {
        Capture {
            reply: Mutex::new(Pending::Nothing),
            area: AtomicUsize::new(0),
            slot,
            bell,
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A panic while this is held leaves at worst a reply that is not sent: its request is
        // answered EIO.
        self.reply.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expect_area(&self, addr: Option<usize>) {
        self.area.store(addr.unwrap_or(0), Ordering::Relaxed);
    }

    /// The reply, if one was sent; the entry waits for its next request after this.
    fn take(&self) -> Option<Captured> {
        match std::mem::replace(&mut *self.pending(), Pending::Nothing) {
            Pending::Sent(c) => Some(c),
            Pending::Nothing | Pending::Parked => None,
        }
    }

    /// After a dispatch whose handler asked to park: the reply, when it came already (the
    /// job ended first, or ran here), else None and the entry is parked until it comes.
    fn park(&self) -> Option<Captured> {
        // The area's loan ended with the dispatch: a later reply's body is never in it.
        self.expect_area(None);
        let mut p = self.pending();
        match std::mem::replace(&mut *p, Pending::Parked) {
            Pending::Sent(c) => {
                *p = Pending::Nothing;
                Some(c)
            }
            Pending::Nothing | Pending::Parked => None,
        }
    }
}

impl ReplySink for Capture {
    fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let area = self.area.load(Ordering::Relaxed);
        let captured = match data {
            [head, body]
                if area != 0
                    && head.len() == OUT_HEADER
                    && body.as_ptr() as usize == area
                    && body.len() <= PAYLOAD =>
            {
                Captured {
                    bytes: head.to_vec(),
                    in_place: Some(body.len()),
                }
            }
            _ => {
                let mut v = Vec::with_capacity(data.iter().map(|d| d.len()).sum());
                for d in data {
                    v.extend_from_slice(d);
                }
                Captured {
                    bytes: v,
                    in_place: None,
                }
            }
        };
        let parked = {
            let mut p = self.pending();
            let parked = matches!(*p, Pending::Parked);
            *p = Pending::Sent(captured);
            parked
        };
        if parked {
            if let Some(bell) = &self.bell {
                bell.ring(self.slot);
            }
        }
        Ok(())
    }
}

/// How the reply to a parked entry reaches its worker, which waits in its ring: the entry's
/// slot goes on `ready`, and a count on an eventfd that the ring always has a read of in
/// flight (`BELL`) wakes the worker.
struct Bell {
    fd: OwnedFd,
    ready: Mutex<Vec<usize>>,
}

impl Bell {
    fn new() -> io::Result<Bell> {
        // SAFETY: eventfd has no memory arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just made and owned by nothing else.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Bell {
            fd,
            ready: Mutex::new(Vec::new()),
        })
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ring(&self, slot: usize) {
        self.ready().push(slot);
        let one = 1u64;
        // SAFETY: eight bytes from a live u64. An eventfd write fails only when the count
        // would pass 2^64 - 2, which one count per reply never reaches.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// The slots whose replies came since the last look.
    fn take(&self) -> Vec<usize> {
        std::mem::take(&mut *self.ready())
    }
}

/// The ring entry's user data of the bell's read (an entry's is its slot).
const BELL: u64 = u64::MAX;

/// Whether the request this thread dispatches may be parked, and whether its handler asked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Park {
    /// Not on a ring worker, or no entry of its queue would be left to take requests.
    Closed,
    Open,
    Asked,
}

thread_local! {
    static PARK: Cell<Park> = const { Cell::new(Park::Closed) };
}

/// Asks the ring worker dispatching this request not to wait for its reply: it parks the
/// entry and goes on with its other entries, and the reply, sent from wherever, commits the
/// entry when it comes (`long.rs`). False, nothing asked: not on a ring worker (fuser's
/// own threads over /dev/fuse, each serving any caller), or this queue's other entries are
/// parked already, so none would be left to take its CPU's requests.
pub(crate) fn park() -> bool {
    PARK.with(|p| {
        let open = p.get() != Park::Closed;
        if open {
            p.set(Park::Asked);
        }
        open
    })
}

thread_local! {
    /// The payload area a ring worker lends the handler of the request it dispatches on this
    /// thread (`ReplyArea::offer`), until the handler takes it or the dispatch ends.
    static REPLY_AREA: Cell<Option<(NonNull<u8>, usize)>> = const { Cell::new(None) };
}

/// The loan of an entry's payload area to the handler of one request: the area's address is
/// in `REPLY_AREA` from `offer` until this is dropped, after the dispatch.
struct ReplyArea {
    addr: usize,
}

impl ReplyArea {
    /// Lends `area`, which nothing else reads or writes until the returned loan is dropped.
    fn offer(area: &mut [u8]) -> ReplyArea {
        let ptr = NonNull::from(&mut *area).cast::<u8>();
        REPLY_AREA.with(|a| a.set(Some((ptr, area.len()))));
        ReplyArea {
            addr: ptr.as_ptr() as usize,
        }
    }
}

impl Drop for ReplyArea {
    fn drop(&mut self) {
        REPLY_AREA.with(|a| a.set(None));
    }
}

/// Runs `f` on the first `len` bytes of the payload area of the ring entry whose request this
/// thread is handling, and `t` (the reply), when it has one that long: a reply whose body `f`
/// builds there (a READ's data) and sends as the body's exact slice goes out without a copy
/// (`Capture`). Err(t), `f` not run, over /dev/fuse, for a request that brought a payload,
/// or the second time in one request.
pub(crate) fn with_reply_area<T, R>(
    len: usize,
    t: T,
    f: impl FnOnce(&mut [u8], T) -> R,
) -> Result<R, T> {
    let Some((ptr, cap)) = REPLY_AREA.with(|a| a.take()) else {
        return Err(t);
    };
    if len > cap {
        return Err(t);
    }
    // SAFETY: `ReplyArea::offer` put a region of `cap` bytes here that nothing else touches
    // until the dispatch that runs this handler returns; `take` above hands it out once.
    let area = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) };
    Ok(f(area, t))
}

/// The `fuse_uring_cmd_req` SQE for entry `slot`: register it (with its iovecs) or commit its
/// reply and fetch the next request.
fn command(
    dev: i32,
    op: u32,
    slot: usize,
    commit_id: u64,
    qid: u16,
    e: &Entry,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut b = opcode::UringCmd80::new(types::Fd(dev), op).cmd(cmd);
    if op == CMD_REGISTER {
        b = b.addr(Some(e.iov.as_ptr() as u64));
    }
    let sqe = b.build().user_data(slot as u64);
    if op != CMD_REGISTER {
        return sqe;
    }
    // Registration also needs sqe->len = 2 (the number of iovecs), which io-uring's builder
    // does not set. SAFETY: Entry128 is repr(C), 128 bytes of plain integers (asserted above);
    // bytes 24..28 are io_uring_sqe.len.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above; every bit pattern is a valid SQE to this type.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

struct Queue<'a> {
    qid: u16,
    dev: i32,
    dispatcher: &'a Dispatcher<IdxFuse>,
    stats: &'a Stats,
    /// Each entry's, by slot.
    captures: Vec<Arc<Capture>>,
    /// None: the eventfd could not be made, and this queue parks nothing.
    bell: Option<Arc<Bell>>,
    /// Entries whose reply is being worked out on a thread of its own (`park`).
    parked: usize,
    /// Where a request goes when its header and argument do not land 8-byte aligned.
    scratch: Vec<u64>,
    handoff: Handoff,
    recent: &'a Recent,
}

impl Queue<'_> {
    fn serve(
        qid: u16,
        pin: Option<usize>,
        handoff: bool,
        recent: &Recent,
        dev: &OwnedFd,
        dispatcher: &Dispatcher<IdxFuse>,
        stats: &Stats,
    ) -> io::Result<()> {
        if let Some(cpu) = pin {
            crate::pin::pin_current_to(cpu);
        }
        let bell = match Bell::new() {
            Ok(b) => Some(Arc::new(b)),
            Err(e) => {
                eprintln!(
                    "idxfs: io_uring queue {qid}: eventfd: {e}; long requests keep the worker"
                );
                None
            }
        };
        let mut q = Queue {
            qid,
            dev: dev.as_raw_fd(),
            dispatcher,
            stats,
            captures: (0..DEPTH)
                .map(|slot| Arc::new(Capture::new(slot, bell.clone())))
                .collect(),
            bell,
            parked: 0,
            scratch: Vec::new(),
            handoff: Handoff::new(handoff),
            recent,
        };
        if q.handoff.is_on() {
            // Never wait for the engine's lock at SCHED_IDLE (`handoff::leave_idle`).
            idxfs_engine::fs::on_lock_wait(Some(crate::handoff::leave_idle));
            recent.worker_hands_off();
        } else if handoff {
            stats.no_handoff.add(1);
        }
        // The entries outlive the ring (declared first, dropped last): closing the ring
        // cancels what the kernel still holds before the buffers go.
        let mut entries: Vec<Entry> = (0..DEPTH).map(|_| Entry::new()).collect();
        // Where the ring reads the bell's count into; outlives the ring as the entries do.
        let mut bell_count = Box::new(0u64);
        let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = match IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build((DEPTH * 2) as u32)
        {
            Ok(r) => r,
            Err(e) => {
                // Nothing registered yet: the kernel never switches to the rings and every
                // request keeps coming through /dev/fuse.
                eprintln!("idxfs: io_uring for queue {qid}: {e}; serving /dev/fuse");
                return Ok(());
            }
        };
        let r = q.run(&mut ring, &mut entries, &mut bell_count);
        drop(ring);
        drop(entries);
        drop(bell_count);
        r
    }

    fn run(
        &mut self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        entries: &mut [Entry],
        bell_count: &mut u64,
    ) -> io::Result<()> {
        let mut pending: Vec<squeue::Entry128> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| command(self.dev, CMD_REGISTER, i, 0, self.qid, e))
            .collect();
        // The bell's read stays in flight for the life of the ring (the read is re-armed as
        // it completes); closing the ring cancels it.
        let bell_read = self.bell.as_ref().map(|b| {
            let read = opcode::Read::new(
                types::Fd(b.fd.as_raw_fd()),
                std::ptr::from_mut(bell_count).cast(),
                8,
            );
            squeue::Entry128::from(read.build().user_data(BELL))
        });
        pending.extend(bell_read.clone());
        let mut live = entries.len();
        // Per entry: whether its command in flight is a registration (else a commit).
        let mut registering = vec![true; entries.len()];
        let mut done = Vec::with_capacity(entries.len());
        let mut complained = false;
        while live > 0 {
            // Not while a request is parked: its thread computes on this CPU (`long.rs`).
            let hand_off = !pending.is_empty()
                && self.parked == 0
                && self.handoff.is_on()
                && self.recent.one_caller();
            for sqe in pending.drain(..) {
                // SAFETY: the buffers the SQE points at (an entry's iovecs) live in `entries`,
                // which outlives the ring.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    return Err(io::Error::other("io_uring submission queue full"));
                }
            }
            // Replies go out at SCHED_IDLE so that their caller wakes on this CPU, while one
            // caller keeps the file system busy (`handoff.rs`). The caller preempts this
            // thread as the submit returns; when the thread runs again, the caller's next
            // request is usually here already (the caller waits on it), and it is served
            // still at SCHED_IDLE, saving two policy changes (3 us here) per round trip. Only
            // the wait for a request that is not here yet is at the thread's own policy.
            let r = if hand_off && self.handoff.idle() {
                ring.submit()
                    .inspect(|_| {
                        if self.handoff.starved() {
                            self.stats.starved.add(1);
                        }
                    })
                    // SAFETY: no argument is passed.
                    .and_then(|_| unsafe { ring.submitter().enter::<()>(0, 0, GETEVENTS, None) })
                    .and_then(|n| {
                        if ring.completion().is_empty() {
                            self.handoff.normal();
                            ring.submit_and_wait(1)
                        } else {
                            Ok(n)
                        }
                    })
            } else {
                self.handoff.normal();
                ring.submit_and_wait(1)
            };
            match r {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    // Giving up would leave this CPU's queue with registered entries and
                    // nobody serving them: its callers would wait until unmount. The errors
                    // possible here (ENOMEM, EAGAIN) pass, so wait and submit again.
                    if !complained {
                        eprintln!("idxfs: io_uring queue {}: {e}; retrying", self.qid);
                        complained = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            }
            done.clear();
            done.extend(
                ring.completion()
                    .map(|c| (c.user_data() as usize, c.result())),
            );
            for &(slot, res) in &done {
                if slot as u64 == BELL {
                    // Re-armed unless the ring is going away; a read that failed otherwise
                    // (it does not) would leave parked entries to the next reply's count.
                    if !matches!(-res, libc::ECANCELED | libc::ENXIO) {
                        pending.extend(bell_read.clone());
                    }
                    self.commit_parked(entries, &mut pending);
                    continue;
                }
                let (Some(e), Some(was_register)) =
                    (entries.get_mut(slot), registering.get_mut(slot))
                else {
                    return Err(io::Error::other("io_uring completion for an unknown entry"));
                };
                if res < 0 {
                    let err = io::Error::from_raw_os_error(-res);
                    match on_error(*was_register, -res) {
                        OnError::Done => live -= 1,
                        OnError::RegisterLater => {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            pending.push(command(self.dev, CMD_REGISTER, slot, 0, self.qid, e));
                        }
                        OnError::Reregister => {
                            eprintln!(
                                "idxfs: FUSE over io_uring queue {}: commit refused ({err}); registering the entry again",
                                self.qid
                            );
                            self.stats.reregistered.add(1);
                            *was_register = true;
                            pending.push(command(self.dev, CMD_REGISTER, slot, 0, self.qid, e));
                        }
                        OnError::GiveUp => {
                            eprintln!(
                                "idxfs: FUSE over io_uring queue {}: {err}; requests go through /dev/fuse",
                                self.qid
                            );
                            live -= 1;
                        }
                    }
                    continue;
                }
                *was_register = false;
                if self.handoff.is_idle() {
                    let h = bytes_of(&mut e.headers);
                    if self.recent.may_serve_idle(u32_at(h, 32), u32_at(h, 4)) {
                        self.stats.served_idle.add(1);
                        self.handoff.served_idle();
                    } else {
                        self.handoff.normal();
                    }
                }
                let commit_id = self.handle(slot, e);
                if self.handoff.starved() {
                    self.stats.starved.add(1);
                }
                match commit_id {
                    Some(id) => pending.push(command(
                        self.dev,
                        CMD_COMMIT_AND_FETCH,
                        slot,
                        id,
                        self.qid,
                        e,
                    )),
                    None => {
                        self.parked += 1;
                        self.stats.parked.add(1);
                    }
                }
            }
        }
        Ok(())
    }

    /// Commits the entries whose replies came from threads of their own since the last look.
    fn commit_parked(&mut self, entries: &mut [Entry], pending: &mut Vec<squeue::Entry128>) {
        let Some(bell) = &self.bell else { return };
        for slot in bell.take() {
            let (Some(e), Some(capture)) = (entries.get_mut(slot), self.captures.get(slot)) else {
                continue;
            };
            let reply = capture.take();
            debug_assert!(
                reply.is_some(),
                "the bell rang for slot {slot} without a reply"
            );
            self.parked = self.parked.saturating_sub(1);
            let commit_id = self.answer(e, reply);
            pending.push(command(
                self.dev,
                CMD_COMMIT_AND_FETCH,
                slot,
                commit_id,
                self.qid,
                e,
            ));
        }
    }

    /// Runs the request in entry `slot` (`e`) and leaves its reply there; returns the commit
    /// id, or None when its handler parked it (`park`) and the reply is still to come.
    fn handle(&mut self, slot: usize, e: &mut Entry) -> Option<u64> {
        self.stats.requests.add(1);
        let Some(capture) = self.captures.get(slot).cloned() else {
            return Some(self.answer(e, None));
        };
        // Disjoint fields: the header area is read while the request is built in `buf`.
        let h = bytes_of(&mut e.headers);
        let in_len = u32_at(h, 0) as usize;
        // fuse_in_header: len, opcode, unique, nodeid, uid, gid, then the caller's pid.
        self.recent.request(u32_at(h, 32));
        let payload = u32_at(h, ENT_IN_OUT_AT + 16) as usize;
        let op_len = in_len
            .checked_sub(IN_HEADER + payload)
            .filter(|&n| n <= OP_IN_MAX && payload <= PAYLOAD);
        let Some(op_len) = op_len else {
            return Some(self.answer(e, None));
        };
        let start = PREFIX - IN_HEADER - op_len;
        let buf = bytes_of(&mut e.buf);
        buf[start..start + IN_HEADER].copy_from_slice(&h[..IN_HEADER]);
        buf[start + IN_HEADER..PREFIX].copy_from_slice(&h[OP_IN_AT..OP_IN_AT + op_len]);
        // A request without a payload leaves the payload area free until its reply: the
        // handler may build the reply's bytes there (`with_reply_area`).
        let (front, area) = buf.split_at_mut(PREFIX);
        let offered = (payload == 0).then(|| ReplyArea::offer(&mut area[..PAYLOAD]));
        capture.expect_area(offered.as_ref().map(|a| a.addr));
        let request: &[u8] = if payload == 0 && start.is_multiple_of(8) {
            &front[start..PREFIX]
        } else if start.is_multiple_of(8) {
            // `offered` is None: nothing else points into the area.
            let buf = bytes_of(&mut e.buf);
            &buf[start..PREFIX + payload]
        } else {
            let n = PREFIX + payload - start;
            self.scratch.clear();
            self.scratch.resize(n.div_ceil(8), 0);
            let s = bytes_of(&mut self.scratch);
            if payload == 0 {
                s[..n].copy_from_slice(&front[start..PREFIX]);
            } else {
                let buf = bytes_of(&mut e.buf);
                s[..n].copy_from_slice(&buf[start..PREFIX + payload]);
            }
            &s[..n]
        };
        // One entry stays to take this CPU's requests while the others are parked.
        let may_park = self.bell.is_some() && self.parked + 1 < DEPTH;
        PARK.with(|p| p.set(if may_park { Park::Open } else { Park::Closed }));
        let sink: Arc<dyn ReplySink> = capture.clone();
        let sent = self.dispatcher.dispatch(request, sink);
        let asked = PARK.with(|p| p.replace(Park::Closed)) == Park::Asked;
        // Before anything else touches the buffer: the area's loan ends here.
        drop(offered);
        let reply = match sent {
            Ok(()) if asked => match capture.park() {
                None => return None,
                r => r,
            },
            Ok(()) => capture.take(),
            Err(_) => None,
        };
        Some(self.answer(e, reply))
    }

    /// Leaves `reply` in `e` for its commit (EIO when there is none: a request we could not
    /// parse, or no reply), and returns the commit id. The entry's header area still holds
    /// the request's.
    fn answer(&mut self, e: &mut Entry, reply: Option<Captured>) -> u64 {
        let h = bytes_of(&mut e.headers);
        let unique = u64_at(h, 8);
        let commit_id = u64_at(h, ENT_IN_OUT_AT + 8);
        let reply = match reply {
            Some(r) if r.bytes.len() >= OUT_HEADER && r.body_len() <= PAYLOAD => r,
            _ => {
                // The caller must not wait forever, and the entry goes back to the kernel.
                self.stats.malformed.add(1);
                let mut r = Vec::with_capacity(OUT_HEADER);
                r.extend_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
                r.extend_from_slice(&(-libc::EIO).to_ne_bytes());
                r.extend_from_slice(&unique.to_ne_bytes());
                Captured {
                    bytes: r,
                    in_place: None,
                }
            }
        };
        let body = reply.body_len();
        h[..OUT_HEADER].copy_from_slice(&reply.bytes[..OUT_HEADER]);
        h[ENT_IN_OUT_AT + 16..ENT_IN_OUT_AT + 20].copy_from_slice(&(body as u32).to_ne_bytes());
        match reply.in_place {
            Some(_) => self.stats.in_place.add(1),
            None => bytes_of(&mut e.buf)[PREFIX..PREFIX + body]
                .copy_from_slice(&reply.bytes[OUT_HEADER..]),
        }
        commit_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_errors() {
        // Teardown ends an entry whatever it was doing.
        for e in [
            libc::ENOTCONN,
            libc::ECANCELED,
            libc::ECONNABORTED,
            libc::ENODEV,
        ] {
            assert_eq!(on_error(true, e), OnError::Done);
            assert_eq!(on_error(false, e), OnError::Done);
        }
        assert_eq!(on_error(true, libc::EAGAIN), OnError::RegisterLater);
        assert_eq!(on_error(true, libc::EINVAL), OnError::GiveUp);
        // A refused commit must not cost the queue its entry.
        assert_eq!(on_error(false, libc::ENOENT), OnError::Reregister);
        assert_eq!(on_error(false, libc::EIO), OnError::Reregister);
        assert_eq!(on_error(false, libc::EAGAIN), OnError::Reregister);
    }

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-2,5,7-8"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list("1-"), None);
    }

    #[test]
    fn register_sqe_carries_two_iovecs() {
        let e = Entry::new();
        let sqe = command(7, CMD_REGISTER, 1, 0, 3, &e);
        // SAFETY: as in `command`.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(u32_at(&raw, 24), 2, "len");
        assert_eq!(u64_at(&raw, 16), e.iov.as_ptr() as u64, "addr");
        assert_eq!(u32_at(&raw, 4), 7, "fd");
        assert_eq!(u64_at(&raw, 32), 1, "user_data");
        // The command starts at byte 48: flags, commit_id, qid.
        assert_eq!(u64_at(&raw, 48 + 8), 0);
        assert_eq!(u16::from_ne_bytes([raw[48 + 16], raw[48 + 17]]), 3);
        let c = command(7, CMD_COMMIT_AND_FETCH, 0, 99, 1, &e);
        // SAFETY: as above.
        let raw: [u8; 128] = unsafe { std::mem::transmute(c) };
        assert_eq!(u64_at(&raw, 48 + 8), 99, "commit id");
        assert_eq!(u32_at(&raw, 24), 0, "no iovecs on commit");
    }
}
