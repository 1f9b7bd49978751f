//! Helper threads for decode steps, called back to back (one sequence: 2 MiB of state, 30-60 us
//! on one core; 16 sequences about 1 ms).
//!
//! Handing such a step to rayon costs as much as a short step on a small host: the caller, outside
//! the pool, sleeps on a condition variable until the helper's share is done and is woken by a
//! system call, and an idle helper falls asleep between steps and must be woken the same way
//! (on a 2-core guest the step's time went from 0.033 to 0.104 ms with how fast the host
//! scheduled both wake-ups: NOTES-CPU.md). Here nobody sleeps inside a step: the caller polls
//! the helpers' completion count, and a helper polls for the next step for [`LINGER`] after each
//! one before it parks, so back-to-back steps (a model's decode loop) cost no system call. The
//! arithmetic of each task does not depend on the thread that runs it.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long a helper polls for the next step after finishing one before it parks: several times
/// a step of one sequence, so that steps called back to back find it awake, and short enough
/// that a helper does not hold a core away from other work for long.
const LINGER: Duration = Duration::from_micros(200);

type Task = dyn Fn(usize) + Sync;

/// The step being run: `f(i)` for `i` in `0..n`, `share` tasks to each thread in turn (the
/// caller first).
struct Job {
    f: *const Task,
    n: usize,
    share: usize,
}

struct Shared {
    /// Bumped by the caller once `job` is written: a helper runs a step when it sees a new value.
    epoch: AtomicU64,
    job: UnsafeCell<Job>,
    /// Helpers done with the current step.
    done: AtomicUsize,
    /// A helper's task panicked during the current step.
    panicked: AtomicBool,
    /// Helper `h` is parked, or about to be: the caller must unpark it after a new `epoch`.
    parked: Vec<AtomicBool>,
    /// A caller owns the helpers (one step at a time).
    busy: AtomicBool,
}

// SAFETY: `job` is written only by the caller that owns `busy`, and only while no helper reads
// it (every helper reported the previous step done, or none has been posted); helpers read it
// only after seeing the `epoch` that the caller published after writing it (release/acquire).
// `f` points at a `Sync` closure that outlives the step (the caller waits for every helper).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// Helper threads with the step protocol above.
pub(crate) struct Helpers {
    shared: &'static Shared,
    threads: Vec<Thread>,
}

/// Resets `busy` when the step ends, however it ends.
struct Owned<'a>(&'a AtomicBool);
impl Drop for Owned<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Helpers {
    /// `count` helper threads, started now; they live as long as the process.
    fn start(count: usize) -> Helpers {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                f: std::ptr::null::<fn(usize)>() as *const Task,
                n: 0,
                share: 0,
            }),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            parked: (0..count).map(|_| AtomicBool::new(false)).collect(),
            busy: AtomicBool::new(false),
        }));
        let threads = (0..count)
            .map(|h| {
                thread::Builder::new()
                    .name(format!("deltanet-helper-{h}"))
                    .spawn(move || helper_loop(shared, h))
                    .expect("starting a helper thread")
                    .thread()
                    .clone()
            })
            .collect();
        Helpers { shared, threads }
    }

    /// The helpers of this process: `count` of them, fixed by the first call.
    pub(crate) fn get(count: usize) -> &'static Helpers {
        static HELPERS: OnceLock<Helpers> = OnceLock::new();
        HELPERS.get_or_init(|| Helpers::start(count))
    }

    /// Runs `f(i)` for every `i` in `0..n`, the first share on the calling thread and one share
    /// on each helper; `false` (nothing run) when another caller is using the helpers. A panic
    /// in any task is raised here once every thread has left the step.
    pub(crate) fn run<'f>(&self, n: usize, f: &'f (dyn Fn(usize) + Sync + 'f)) -> bool {
        let s = self.shared;
        if s.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let _owned = Owned(&s.busy);
        let count = self.threads.len();
        let share = n.div_ceil(count + 1);
        // SAFETY: the lifetime is erased only for the helpers' reads, all of which end before
        // this function returns (it waits for `done` below, panics included).
        let f_static =
            unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + 'f), *const Task>(f) };
        // SAFETY: this caller owns `busy` and every helper finished the previous step (the
        // previous owner waited for them), so nobody reads `job` now.
        unsafe {
            *s.job.get() = Job {
                f: f_static,
                n,
                share,
            }
        };
        s.done.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        for (parked, t) in s.parked.iter().zip(&self.threads) {
            if parked.load(Ordering::SeqCst) {
                t.unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| (0..share.min(n)).for_each(f)));
        let start = Instant::now();
        let mut polls = 0u32;
        while s.done.load(Ordering::Acquire) < count {
            polls = polls.wrapping_add(1);
            if polls % 64 == 0 && start.elapsed() > LINGER {
                // A helper that was parked and not yet scheduled: let it have this core.
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            resume_unwind(
                Box::new("a task panicked on a deltanet helper thread") as Box<dyn Any + Send>
            );
        }
        true
    }
}

fn helper_loop(s: &'static Shared, h: usize) {
    // Epoch 0 is the one `start` created: a step posted before this thread first looks is run.
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut polls = 0u32;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            polls = polls.wrapping_add(1);
            if polls % 64 == 0 && start.elapsed() > LINGER {
                // `parked` before the last look at `epoch` (both sequentially consistent): either
                // this look sees the new step or its caller sees `parked` and unparks.
                s.parked[h].store(true, Ordering::SeqCst);
                if s.epoch.load(Ordering::SeqCst) == seen {
                    thread::park();
                }
                s.parked[h].store(false, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
        };
        seen = epoch;
        // SAFETY: see `Shared`: the caller wrote `job` before publishing `epoch` and waits for
        // `done` before its closure goes away.
        let job = unsafe { &*s.job.get() };
        let f = unsafe { &*job.f };
        let (start, end) = ((h + 1) * job.share, job.n.min((h + 2) * job.share));
        if catch_unwind(AssertUnwindSafe(|| (start..end).for_each(f))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}
