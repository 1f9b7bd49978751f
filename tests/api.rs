//! The output conventions: dtype of o, which states come back, and their layouts.

mod common;

use common::{as_f32, make_case, Spec};
use deltanet::{forward, DType, Device, Options};

fn spec(dtype: DType) -> Spec {
    Spec {
        b: 2,
        t: 70,
        h: 2,
        ratio: 2,
        k: 12,
        v: 10,
        chunk_size: 32,
        varlen: false,
        dtype,
        seed: 11,
        flags: 1 << 7,
    }
}

#[test]
fn o_follows_the_input_dtype_unless_asked() {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (x, mut opts) = make_case(&spec(dtype));
        opts.out_dtype = None;
        let native = forward(&Device::Cpu, &x, &opts).unwrap();
        assert_eq!(native.o.dtype(), dtype);
        opts.out_dtype = Some(DType::F32);
        let wide = forward(&Device::Cpu, &x, &opts).unwrap();
        assert_eq!(wide.o.dtype(), DType::F32);
        // The narrow output is the wide one rounded.
        assert_eq!(as_f32(&native.o), common::rounded(&as_f32(&wide.o), dtype));
    }
}

#[test]
fn states_come_back_only_when_asked() {
    let (x, opts) = make_case(&spec(DType::F32));
    let out = forward(
        &Device::Cpu,
        &x,
        &Options {
            output_final_state: false,
            ..opts.clone()
        },
    )
    .unwrap();
    assert!(out.final_state.is_none() && out.chunk_states.is_none());
    let out = forward(
        &Device::Cpu,
        &x,
        &Options {
            output_chunk_states: true,
            ..opts
        },
    )
    .unwrap();
    // 70 tokens in chunks of 32: 3 chunks per sequence, 2 sequences.
    assert_eq!(out.chunk_states.unwrap().shape(), &[6, 4, 12, 10]);
    assert_eq!(out.final_state.unwrap().shape(), &[2, 4, 12, 10]);
}

#[test]
fn v_first_states_are_the_transpose() {
    let (x, opts) = make_case(&spec(DType::F32));
    let kv = forward(&Device::Cpu, &x, &opts)
        .unwrap()
        .final_state
        .unwrap();
    let mut x_vk = x.clone();
    let h0 = as_f32(x.initial_state.as_ref().unwrap());
    let mut t = vec![0f32; h0.len()];
    for (s, d) in h0.chunks_exact(120).zip(t.chunks_exact_mut(120)) {
        for r in 0..12 {
            for c in 0..10 {
                d[c * 12 + r] = s[r * 10 + c];
            }
        }
    }
    x_vk.initial_state = Some(deltanet::Tensor::from_f32(t, vec![2, 4, 10, 12]).unwrap());
    let vk = forward(
        &Device::Cpu,
        &x_vk,
        &Options {
            state_v_first: true,
            ..opts
        },
    )
    .unwrap()
    .final_state
    .unwrap();
    assert_eq!(vk.shape(), &[2, 4, 10, 12]);
    let (kv, vk) = (as_f32(&kv), as_f32(&vk));
    for n in 0..8 {
        for r in 0..12 {
            for c in 0..10 {
                assert_eq!(kv[n * 120 + r * 10 + c], vk[n * 120 + c * 12 + r]);
            }
        }
    }
}
