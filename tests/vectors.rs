//! The shared conformance vectors: the CPU forward and the recurrent path reproduce the exact
//! float64 answers, and so does the crate's own oracle.

mod common;

use deltanet::reference::{reference, rel_l2};
use deltanet::{forward, recurrent_step, DType, Device, Inputs};

#[test]
fn oracle_matches_vectors() {
    for case in common::all_cases() {
        let r = reference(&case.inputs, &case.opts).unwrap();
        let eo = rel_l2(
            &r.o.iter().map(|&x| x as f32).collect::<Vec<_>>(),
            &case.o_ref,
        );
        let es = rel_l2(
            &r.final_state.iter().map(|&x| x as f32).collect::<Vec<_>>(),
            &case.final_state_ref,
        );
        assert!(
            eo < 1e-6 && es < 1e-6,
            "{}: oracle o {eo:e} state {es:e}",
            case.name
        );
    }
}

#[test]
fn cpu_forward_matches_vectors() {
    for case in common::all_cases() {
        for chunk_size in deltanet::CHUNK_SIZES {
            let opts = deltanet::Options {
                chunk_size,
                ..case.opts.clone()
            };
            let out = forward(&Device::Cpu, &case.inputs, &opts).unwrap();
            assert_eq!(out.o.dtype(), DType::F32);
            let eo = rel_l2(&common::as_f32(&out.o), &case.o_ref);
            let es = rel_l2(
                &common::as_f32(out.final_state.as_ref().unwrap()),
                &case.final_state_ref,
            );
            println!(
                "{} BT={chunk_size}: o {eo:.2e}, final_state {es:.2e}",
                case.name
            );
            assert!(
                eo <= 1e-5,
                "{} BT={chunk_size}: o rel err {eo:e}",
                case.name
            );
            assert!(
                es <= 1e-5,
                "{} BT={chunk_size}: final_state rel err {es:e}",
                case.name
            );
        }
    }
}

#[test]
fn cpu_recurrent_matches_vectors() {
    for case in common::all_cases() {
        let p = deltanet::Problem::from_inputs(&case.inputs, &case.opts).unwrap();
        let mut state = match &case.inputs.initial_state {
            Some(s) => common::as_f32(s),
            None => vec![0f32; p.num_seqs() * p.v_heads() * p.state_len()],
        };
        let x = Inputs {
            initial_state: None,
            ..case.inputs.clone()
        };
        let o = recurrent_step(&Device::Cpu, &x, &mut state, &case.opts).unwrap();
        let eo = rel_l2(&common::as_f32(&o), &case.o_ref);
        let es = rel_l2(&state, &case.final_state_ref);
        assert!(
            eo <= 1e-5 && es <= 1e-5,
            "{}: recurrent o {eo:e} state {es:e}",
            case.name
        );
    }
}
