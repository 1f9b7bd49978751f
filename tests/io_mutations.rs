//! A deterministic stand-in for the `cargo fuzz` target (fuzz/fuzz_targets/input_file.rs) that
//! runs in every `cargo test`: thousands of mutations of small valid problem files (bit flips,
//! truncations, splices, and edits of the JSON header's shapes, offsets, dtypes and metadata)
//! go through the same entry point — parse, validate, and for tiny problems the forward. Errors
//! are fine; a panic fails the test.

use std::path::Path;

use deltanet::selftest::Rng;

const SEEDS: [&[u8]; 5] = [
    include_bytes!("../fuzz/seeds/basic.safetensors"),
    include_bytes!("../fuzz/seeds/bf16.safetensors"),
    include_bytes!("../fuzz/seeds/varlen.safetensors"),
    include_bytes!("../fuzz/seeds/gate.safetensors"),
    include_bytes!("../fuzz/seeds/refs.safetensors"),
];

/// The fuzz target's body.
fn entry(data: &[u8]) {
    let path = Path::new("mutant.safetensors");
    let Ok(pf) = deltanet::io::parse(data, path) else {
        return;
    };
    let Ok(p) = pf.problem(path, &pf.options) else {
        return;
    };
    if deltanet::io::forward_bytes(&p, &pf.options) < (1 << 20) {
        let _ = deltanet::forward(&deltanet::Device::Cpu, &pf.inputs, &pf.options);
    }
}

fn split(seed: &[u8]) -> (String, Vec<u8>) {
    let n = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) as usize;
    (
        String::from_utf8(seed[8..8 + n].to_vec()).expect("utf8 header"),
        seed[8 + n..].to_vec(),
    )
}

fn join(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

const NUMBERS: [&str; 12] = [
    "0",
    "1",
    "2",
    "3",
    "7",
    "-1",
    "65",
    "100000",
    "4294967296",
    "18446744073709551615",
    "1e400",
    "null",
];
const WORDS: [&str; 10] = [
    "\"F32\"",
    "\"F64\"",
    "\"I32\"",
    "\"I64\"",
    "\"BF16\"",
    "\"U8\"",
    "true",
    "\"tiled\"",
    "[]",
    "{}",
];

/// Replaces one JSON number or string token of the header by another.
fn mutate_header(h: &str, rng: &mut Rng) -> String {
    let bytes = h.as_bytes();
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| {
            let c = bytes[i];
            (c.is_ascii_digit() || c == b'"')
                && (i == 0 || !bytes[i - 1].is_ascii_digit() && bytes[i - 1] != b'.')
        })
        .collect();
    if starts.is_empty() {
        return h.to_string();
    }
    let s = starts[rng.int(0, starts.len() - 1)];
    let e = if bytes[s] == b'"' {
        bytes[s + 1..]
            .iter()
            .position(|&c| c == b'"')
            .map_or(bytes.len(), |p| s + p + 2)
    } else {
        bytes[s..]
            .iter()
            .position(|c| !(c.is_ascii_digit() || *c == b'.' || *c == b'e' || *c == b'-'))
            .map_or(bytes.len(), |p| s + p)
    };
    let with = if rng.chance(0.6) {
        NUMBERS[rng.int(0, NUMBERS.len() - 1)]
    } else {
        WORDS[rng.int(0, WORDS.len() - 1)]
    };
    format!("{}{}{}", &h[..s], with, &h[e..])
}

fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    match rng.int(0, 5) {
        0 => {
            let mut b = seed.to_vec();
            for _ in 0..rng.int(1, 8) {
                let i = rng.int(0, b.len() - 1);
                b[i] ^= 1 << rng.int(0, 7);
            }
            b
        }
        1 => seed[..rng.int(0, seed.len())].to_vec(),
        2 => {
            let mut b = seed.to_vec();
            let i = rng.int(0, b.len());
            let junk: Vec<u8> = (0..rng.int(1, 16)).map(|_| rng.next_u64() as u8).collect();
            b.splice(i..i, junk);
            b
        }
        3 => {
            let mut b = seed.to_vec();
            let i = rng.int(0, b.len() - 1);
            b[i] = [0u8, 0xff, 0x7f, 0x80, b'9', b'"', b'{'][rng.int(0, 6)];
            b
        }
        _ => {
            // Header edits keep the data, so the file stays well-formed safetensors often
            // enough to reach the shape checks and the forward.
            let (mut h, data) = split(seed);
            for _ in 0..rng.int(1, 3) {
                h = mutate_header(&h, rng);
            }
            let mut data = data;
            if rng.chance(0.2) {
                data.truncate(rng.int(0, data.len()));
            }
            join(&h, &data)
        }
    }
}

#[test]
fn seeds_are_valid_problems() {
    for s in SEEDS {
        let pf = deltanet::io::parse(s, Path::new("seed")).expect("seed parses");
        pf.problem(Path::new("seed"), &pf.options)
            .expect("seed is a valid problem");
    }
}

#[test]
fn mutated_input_files_never_panic() {
    let mut rng = Rng::new(0xF022);
    let mut accepted = 0;
    for i in 0..50_000 {
        let seed = SEEDS[i % SEEDS.len()];
        let m = mutate(seed, &mut rng);
        let path = Path::new("m");
        if let Ok(pf) = deltanet::io::parse(&m, path) {
            if pf.problem(path, &pf.options).is_ok() {
                accepted += 1;
            }
        }
        entry(&m);
    }
    println!("{accepted} of 50000 mutants were valid problems");
    // The mutations must not all be rejected at the first byte: some reach the forward.
    assert!(
        accepted > 100,
        "only {accepted} mutants were valid problems"
    );
}
