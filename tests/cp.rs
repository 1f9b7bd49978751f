//! Context parallelism in one process: a packed batch split among 2..8 ranks (threads, through
//! the in-process exchange) gives the plain forward's outputs and final states, on random
//! problems (varlen with empty sequences, sequences spanning several ranks, empty ranks, every
//! option). On the CPU here; the same code runs on any device.

use deltanet::cp::{forward_ranks, RankOutput};
use deltanet::reference::rel_l2;
use deltanet::selftest::{Case, Rng, Spec};
use deltanet::{forward, Device, Inputs, Output};

/// A random packed problem (B = 1) and random cuts of its tokens among `ranks` ranks.
fn packed_case(rng: &mut Rng, ranks: usize) -> (Case, Vec<usize>) {
    let mut spec = Spec::random(rng);
    spec.b = 1;
    let c = spec.build().unwrap();
    let t = c.inputs.q.shape()[1];
    let mut cuts: Vec<usize> = (0..ranks - 1).map(|_| rng.int(0, t)).collect();
    cuts.push(0);
    cuts.push(t);
    cuts.sort_unstable();
    (c, cuts)
}

#[test]
fn ranks_equal_the_plain_forward_on_random_problems() {
    let mut rng = Rng::new(0xc0de);
    let (mut worst_o, mut worst_f, mut spanning) = (0f64, 0f64, 0);
    for case in 0..60 {
        let ranks = rng.int(2, 8);
        let (c, cuts) = packed_case(&mut rng, ranks);
        let (x, opts) = (&c.inputs, &c.opts);
        let t = x.q.shape()[1];
        let want = forward(&Device::Cpu, x, opts).unwrap();
        let got = forward_ranks(&Device::Cpu, x, opts, &cuts).unwrap();
        let what = format!("case {case} {} cuts {cuts:?}", c.name);
        let (e_o, e_f) = ranks_error(&what, x, &cuts, &got, &want);
        worst_o = worst_o.max(e_o);
        worst_f = worst_f.max(e_f);
        let cu = x.cu_seqlens.clone().unwrap_or(vec![0, t as i64]);
        spanning += usize::from(cu.windows(2).any(|w| {
            cuts.iter()
                .any(|&c| (w[0] as usize) < c && c < w[1] as usize)
        }));
    }
    eprintln!(
        "60 problems: worst o {worst_o:.2e}, final state {worst_f:.2e}; {spanning} with a \
         sequence split between ranks"
    );
    assert!(spanning > 30, "only {spanning} problems split a sequence");
}

/// Relative L2 errors of the ranks' `o` (in token order) and final states (gathered by
/// sequence) against the plain forward's, after checking each rank's tokens and that every
/// sequence's final state is on exactly one rank; asserts both within 1e-5.
fn ranks_error(
    what: &str,
    x: &Inputs<'_>,
    cuts: &[usize],
    got: &[RankOutput],
    want: &Output,
) -> (f64, f64) {
    let mut o = Vec::new();
    for (r, out) in got.iter().enumerate() {
        assert_eq!(out.tokens, cuts[r]..cuts[r + 1], "{what}");
        o.extend_from_slice(&out.o.to_f32());
    }
    let want_o: Vec<f64> = want.o.to_f32().iter().map(|&v| v as f64).collect();
    let e_o = rel_l2(&o, &want_o);
    assert!(e_o <= 1e-5, "{what}: o {e_o:.2e}");

    let want_f = want.final_state.as_ref().unwrap().to_f32().into_owned();
    let n = x.cu_seqlens.as_ref().map_or(1, |c| c.len() - 1);
    let per = want_f.len() / n;
    let mut f = vec![f32::NAN; want_f.len()];
    let mut seen = vec![0; n];
    for out in got {
        let states = out.final_state.as_ref().unwrap().to_f32();
        for (i, &s) in out.final_seqs.iter().enumerate() {
            seen[s] += 1;
            f[s * per..][..per].copy_from_slice(&states[i * per..][..per]);
        }
    }
    assert!(
        seen.iter().all(|&k| k == 1),
        "{what}: final states per sequence {seen:?}"
    );
    let want_f: Vec<f64> = want_f.iter().map(|&v| v as f64).collect();
    let e_f = rel_l2(&f, &want_f);
    assert!(e_f <= 1e-5, "{what}: final state {e_f:.2e}");
    (e_o, e_f)
}

/// The NCCL exchange on this machine's GPUs, one rank each: its all-gather returns every rank's
/// buffer of its own length, and ranks over it give the plain forward's outputs and final states
/// on random problems (one rank where there is one GPU). Skipped without a GPU or libnccl.
#[cfg(feature = "nccl")]
#[test]
fn nccl_ranks_equal_the_plain_forward_on_the_gpus() {
    use deltanet::cp::{forward_ranks_nccl, Exchange};
    let gpus: Vec<Device> = (0..8).map_while(|i| Device::cuda(i).ok()).collect();
    if gpus.is_empty() {
        eprintln!("SKIPPED: nccl_ranks_equal_the_plain_forward_on_the_gpus (no GPU)");
        return;
    }
    let ex = match deltanet::cuda::nccl::Nccl::new(&gpus) {
        Ok(ex) => ex,
        Err(deltanet::Error::CudaUnavailable(m)) => {
            eprintln!("SKIPPED: nccl_ranks_equal_the_plain_forward_on_the_gpus ({m})");
            return;
        }
        Err(e) => panic!("NCCL setup: {e}"),
    };
    let ranks = gpus.len();
    let gathered: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let ex = &ex;
        let hs: Vec<_> = (0..ranks)
            .map(|r| s.spawn(move || ex.all_gather(r, vec![r as f32 + 0.5; 3 + r]).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, all) in gathered.iter().enumerate() {
        let want: Vec<Vec<f32>> = (0..ranks).map(|i| vec![i as f32 + 0.5; 3 + i]).collect();
        assert_eq!(all, &want, "rank {r}'s all-gather");
    }
    drop(ex);
    let mut rng = Rng::new(0x5eed);
    let mut worst = 0f64;
    for case in 0..6 {
        let (c, cuts) = packed_case(&mut rng, ranks);
        let (x, opts) = (&c.inputs, &c.opts);
        let want = forward(&gpus[0], x, opts).unwrap();
        let got = forward_ranks_nccl(&gpus, x, opts, &cuts).unwrap();
        let what = format!("case {case} {} cuts {cuts:?}", c.name);
        let (e_o, e_f) = ranks_error(&what, x, &cuts, &got, &want);
        worst = worst.max(e_o).max(e_f);
    }
    eprintln!("NCCL on {ranks} GPU(s): 6 problems, worst relative L2 {worst:.2e}");
}

#[test]
fn bad_cuts_and_batches_are_refused() {
    let mut rng = Rng::new(5);
    let mut spec = Spec::random(&mut rng);
    spec.b = 1;
    spec.t = 10;
    let c = spec.build().unwrap();
    for cuts in [vec![0, 11], vec![1, 10], vec![0, 6, 4, 10], vec![0]] {
        let e = forward_ranks(&Device::Cpu, &c.inputs, &c.opts, &cuts).unwrap_err();
        assert!(e.to_string().starts_with("cuts:"), "{cuts:?}: {e}");
    }
    spec.b = 2;
    spec.varlen = false;
    let c = spec.build().unwrap();
    let e = forward_ranks(&Device::Cpu, &c.inputs, &c.opts, &[0, 5, 10]).unwrap_err();
    assert!(e.to_string().starts_with("q:"), "{e}");
}

/// `forward_rank` called by hand (as a process of a multi-process job would) with a malformed
/// shard, initial state, offsets, token range or rank number: an error naming the argument on
/// that rank, never a panic; and with two ranks on threads, the other rank still returns (the
/// failing one reaches the exchange), so a bad shard cannot hang the job.
#[test]
fn forward_rank_refuses_bad_shards_without_hanging_the_others() {
    use deltanet::cp::{forward_rank, InProcess};
    use deltanet::Tensor;
    let mut rng = Rng::new(11);
    let mut spec = Spec::random(&mut rng);
    spec.b = 1;
    spec.t = 10;
    spec.varlen = false;
    let c = spec.build().unwrap();
    let (x, opts) = (&c.inputs, &c.opts);
    let shard = |rows: std::ops::Range<usize>| {
        let cut = |t: &Tensor<'_>| {
            let per: usize = t.shape()[2..].iter().product::<usize>() * t.dtype().size();
            let mut shape = t.shape().to_vec();
            shape[1] = rows.len();
            Tensor::from_bytes(
                t.dtype(),
                &t.as_bytes()[rows.start * per..rows.end * per],
                shape,
            )
            .unwrap()
            .into_owned()
        };
        Inputs {
            q: cut(&x.q),
            k: cut(&x.k),
            v: cut(&x.v),
            g: cut(&x.g),
            beta: cut(&x.beta),
            cu_seqlens: None,
            ..x.clone()
        }
    };
    let whole = [0i64, 10];
    let one = || InProcess::new(1);
    let run = |s: &Inputs<'_>, cu: &[i64], tokens: std::ops::Range<usize>, rank: usize| {
        forward_rank(&Device::Cpu, s, cu, tokens, opts, rank, &one())
    };
    assert!(run(&shard(0..10), &whole, 0..10, 0).is_ok());
    let mut bad_k = shard(0..10);
    let kd = bad_k.k.shape().to_vec();
    bad_k.k = Tensor::from_f32(vec![0.1; kd.iter().product()], vec![kd[1], kd[2], kd[3]]).unwrap();
    let mut bad_h0 = shard(0..10);
    bad_h0.initial_state = Some(Tensor::from_f32(vec![0.0; 4], vec![1, 1, 2, 2]).unwrap());
    for (what, s, cu, tokens, rank, arg) in [
        ("k of rank 3", &bad_k, &whole[..], 0..10, 0, "k:"),
        (
            "an initial state not [N, HV, K, V]",
            &bad_h0,
            &whole[..],
            0..10,
            0,
            "initial_state:",
        ),
        (
            "offsets from -5",
            &shard(0..10),
            &[-5i64, 10][..],
            0..10,
            0,
            "cu_seqlens:",
        ),
        (
            "falling offsets",
            &shard(0..10),
            &[0i64, 7, 5, 10][..],
            0..10,
            0,
            "cu_seqlens:",
        ),
        (
            "tokens past the batch",
            &shard(0..10),
            &[0i64, 8][..],
            0..10,
            0,
            "tokens:",
        ),
        ("rank 3 of 1", &shard(0..10), &whole[..], 0..10, 3, "rank:"),
    ] {
        let e = run(s, cu, tokens, rank).unwrap_err();
        assert!(e.to_string().starts_with(arg), "{what}: {e}");
    }
    // Two ranks; rank 0's shard is malformed.
    let ex = InProcess::new(2);
    let (bad, good) = (
        Inputs {
            k: bad_k.k.clone(),
            ..shard(0..5)
        },
        shard(5..10),
    );
    let (r0, r1) = std::thread::scope(|sc| {
        let a = sc.spawn(|| forward_rank(&Device::Cpu, &bad, &whole, 0..5, opts, 0, &ex));
        let b = sc.spawn(|| forward_rank(&Device::Cpu, &good, &whole, 5..10, opts, 1, &ex));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(r0.unwrap_err().to_string().starts_with("k:"));
    assert!(r1.is_ok(), "{:?}", r1.err());
}

/// NCCL ranks need one GPU each: the CPU, or fewer devices than ranks, are refused by name
/// before any library is opened.
#[cfg(feature = "nccl")]
#[test]
fn nccl_ranks_refuse_the_cpu_and_a_device_count_off_the_ranks() {
    use deltanet::cp::forward_ranks_nccl;
    let mut rng = Rng::new(6);
    let (c, _) = packed_case(&mut rng, 2);
    let t = c.inputs.q.shape()[1];
    let cpus = [Device::Cpu, Device::Cpu];
    for (devices, cuts) in [
        (&cpus[..], vec![0, t / 2, t]),
        (&cpus[..1], vec![0, t / 2, t]),
    ] {
        let e = forward_ranks_nccl(devices, &c.inputs, &c.opts, &cuts).unwrap_err();
        assert!(e.to_string().starts_with("devices:"), "{e}");
    }
}
