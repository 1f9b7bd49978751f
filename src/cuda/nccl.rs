//! The context-parallel summaries exchanged through NCCL (`crate::cp::Exchange`), one GPU per
//! rank (cargo feature `nccl`, on by default). libnccl is loaded at run time like the driver,
//! found as `libnccl.so` on the loader's path (the `nvidia-nccl-cu13` wheel ships
//! `libnccl.so.2`; a `libnccl.so` link to it, on `LD_LIBRARY_PATH`, is enough). NVLink SHARP (NVLS) multicast stays off: it is disabled in the
//! environment before the communicators are made, unless the caller already set it.

use std::sync::{Arc, Mutex};

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::safe::{Comm, NcclType};

use crate::cp::Exchange;
use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::Device;

/// One communicator per rank, rank r on `devices[r]`, made at once in this process
/// (`ncclCommInitAll`); rank r's thread calls [`Exchange::all_gather`] with `rank = r`.
pub struct Nccl {
    comms: Vec<Mutex<RankComm>>,
}

/// A communicator, used by one thread at a time (the mutex around it).
struct RankComm(Comm);
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not overlap,
// which the mutex holding each one guarantees.
unsafe impl Send for RankComm {}

fn nccl_err(what: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> Error {
    move |e| Error::Internal(format!("NCCL ({what}): {e:?}"))
}

fn driver_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Internal(format!("CUDA copy for the NCCL exchange ({what}): {e:?}"))
}

impl Nccl {
    /// Communicators for `devices.len()` ranks, one per GPU (distinct GPUs: NCCL refuses two
    /// ranks on one device). [`Error::CudaUnavailable`] when libnccl cannot be loaded.
    pub fn new(devices: &[Device]) -> Result<Nccl> {
        if devices.is_empty() {
            return Err(Error::invalid("devices", "at least one GPU", "none"));
        }
        let devices = devices
            .iter()
            .map(|d| match d {
                Device::Cuda(g) => Ok(g.clone()),
                Device::Cpu => Err(Error::invalid("devices", "GPUs for NCCL", "the CPU")),
            })
            .collect::<Result<Vec<Arc<CudaDevice>>>>()?;
        let mut ordinals: Vec<usize> = devices.iter().map(|d| d.ordinal()).collect();
        ordinals.sort_unstable();
        if ordinals.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::invalid(
                "devices",
                "one distinct GPU per NCCL rank",
                format!("GPUs {ordinals:?}"),
            ));
        }
        // cudarc opens `libnccl.so` first and panics where it finds no library; so it is opened
        // here first (a no-op where cudarc links libnccl at build time).
        // SAFETY: opening libnccl runs no initialiser that touches this process's state.
        if unsafe { libloading::Library::new("libnccl.so") }.is_err() {
            return Err(Error::CudaUnavailable(
                "the NCCL library (libnccl.so) cannot be loaded".into(),
            ));
        }
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // Set before NCCL reads its environment (at its first communicator).
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
        }
        let streams = devices.iter().map(|d| d.stream().clone()).collect();
        let comms = Comm::from_devices(streams).map_err(nccl_err("communicator setup"))?;
        Ok(Nccl {
            comms: comms.into_iter().map(|c| Mutex::new(RankComm(c))).collect(),
        })
    }
}

/// Every rank's `mine` (all of one length), in rank order: copied to the rank's GPU,
/// all-gathered, copied back (the copy back synchronises the rank's stream).
fn gather<T>(comm: &Comm, mine: &[T], what: &'static str) -> Result<Vec<T>>
where
    T: NcclType + DeviceRepr + ValidAsZeroBits,
{
    let stream = comm.stream();
    let send = stream.clone_htod(mine).map_err(driver_err(what))?;
    let mut recv = stream
        .alloc_zeros::<T>(comm.world_size() * mine.len())
        .map_err(driver_err(what))?;
    comm.all_gather(&send, &mut recv).map_err(nccl_err(what))?;
    stream.clone_dtoh(&recv).map_err(driver_err(what))
}

impl Exchange for Nccl {
    fn ranks(&self) -> usize {
        self.comms.len()
    }

    /// Two all-gathers on the rank's GPU: the buffers' lengths, then the buffers padded to the
    /// longest; the rank's stream is synchronised before the results come back to the host.
    fn all_gather(&self, rank: usize, mine: Vec<f32>) -> Result<Vec<Vec<f32>>> {
        let ranks = self.comms.len();
        let cell = self.comms.get(rank).ok_or_else(|| {
            Error::invalid("rank", format!("a rank below {ranks}"), rank.to_string())
        })?;
        let guard = cell
            .lock()
            .map_err(|_| Error::Internal("a rank panicked during the exchange".into()))?;
        let comm = &guard.0;
        let lens = gather(comm, &[mine.len() as u64], "all-gather of the lengths")?;
        let longest = lens.iter().copied().max().unwrap_or(0) as usize;
        if longest == 0 {
            return Ok(vec![Vec::new(); ranks]);
        }
        let mut padded = mine;
        padded.resize(longest, 0.0);
        let all = gather(comm, &padded, "all-gather of the summaries")?;
        Ok(all
            .chunks_exact(longest)
            .zip(&lens)
            .map(|(c, &n)| c[..n as usize].to_vec())
            .collect())
    }
}
