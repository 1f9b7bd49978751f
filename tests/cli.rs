//! The `deltanet` binary end to end: it reproduces the shared conformance vectors, rejects bad
//! input with a one-line message and the right exit code, never leaves a partial or clobbered
//! output, and its selftest, bench and demo commands work.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use deltanet::reference::rel_l2;

const BIN: &str = env!("CARGO_BIN_EXE_deltanet");

/// The shared conformance vectors: `../shared/vectors` beside the checkout, or the folder named
/// by `DELTANET_VECTORS`.
fn vectors_dir() -> PathBuf {
    std::env::var_os("DELTANET_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/vectors")))
}

/// The vectors folder, or `None` after saying on the terminal that `test` is skipped. Written
/// to the process's stderr directly, past the test harness's capture, so a skip is never a
/// silent "ok".
fn shared_vectors(test: &str) -> Option<PathBuf> {
    let d = vectors_dir();
    if d.is_dir() {
        return Some(d);
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "test {test}: SKIPPED: {} is missing; these tests need the shared conformance vectors \
         (check out ../shared beside this checkout, or set DELTANET_VECTORS to a copy)",
        d.display()
    );
    None
}

fn vector_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(vectors_dir())
        .expect("../shared/vectors must exist beside the checkout (or DELTANET_VECTORS)")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no vector files");
    v
}

/// A fresh empty folder for one test, removed when the test passes (kept, for a look, when it
/// fails).
fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("deltanet-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    Scratch(d)
}

/// See [`scratch`].
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn deltanet<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run the deltanet binary")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Tensors of a safetensors file: dtype name, shape, raw bytes.
fn read_st(path: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).expect("read output");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("output is valid safetensors");
    st.tensors()
        .into_iter()
        .map(|(n, t)| {
            (
                n,
                format!("{:?}", t.dtype()),
                t.shape().to_vec(),
                t.data().to_vec(),
            )
        })
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f64s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            f64::from_le_bytes(a)
        })
        .collect()
}

fn find<'a>(
    ts: &'a [(String, String, Vec<usize>, Vec<u8>)],
    name: &str,
) -> &'a (String, String, Vec<usize>, Vec<u8>) {
    ts.iter()
        .find(|t| t.0 == name)
        .unwrap_or_else(|| panic!("tensor {name} missing"))
}

#[test]
fn run_reproduces_the_shared_vectors() {
    if shared_vectors("run_reproduces_the_shared_vectors").is_none() {
        return;
    }
    let dir = scratch("vectors");
    for f in vector_files() {
        let out = dir.join(f.file_name().expect("name"));
        let o = deltanet(&argv(
            "run --input {} --output {} --out-dtype f32 --device cpu",
            &[&f, &out],
        ));
        assert!(o.status.success(), "{}: {}", f.display(), stderr(&o));
        let got = read_st(&out);
        let want = read_st(&f);
        let (_, dt, shape, o_bytes) = find(&got, "o");
        assert_eq!(dt, "F32");
        assert_eq!(shape, &find(&want, "o_ref").2);
        let eo = rel_l2(&f32s(o_bytes), &f64s(&find(&want, "o_ref").3));
        let es = rel_l2(
            &f32s(&find(&got, "final_state").3),
            &f64s(&find(&want, "final_state_ref").3),
        );
        println!("{}: o {eo:.2e}, final_state {es:.2e}", f.display());
        assert!(eo <= 1e-5, "{}: o rel err {eo:e}", f.display());
        assert!(es <= 1e-5, "{}: final_state rel err {es:e}", f.display());
    }
}

#[test]
fn run_auto_device_falls_back_and_writes_input_dtype() {
    let Some(vectors) = shared_vectors("run_auto_device_falls_back_and_writes_input_dtype") else {
        return;
    };
    let dir = scratch("auto");
    let f = vectors.join("bf16_qwen_like.safetensors");
    let out = dir.join("o.safetensors");
    let o = deltanet(&argv("run -i {} -o {}", &[&f, &out]));
    assert!(o.status.success(), "{}", stderr(&o));
    let got = read_st(&out);
    // FLA's convention: o in the input's dtype unless asked otherwise; states in f32.
    assert_eq!(find(&got, "o").1, "BF16");
    assert_eq!(find(&got, "final_state").1, "F32");
}

#[test]
fn flags_override_metadata_and_intermediate_states() {
    let Some(vectors) = shared_vectors("flags_override_metadata_and_intermediate_states") else {
        return;
    };
    let dir = scratch("flags");
    let f = vectors.join("odd_dims.safetensors");
    let out = dir.join("o.safetensors");
    let o = deltanet(&argv(
"run --input {} --output {} --out-dtype f32 --device cpu --scale 0.25 --use-qk-l2norm --chunk-size 16 --intermediate-states",
&[&f, &out],
));
    assert!(o.status.success(), "{}", stderr(&o));
    let got = read_st(&out);

    // The same computation through the library.
    let file = deltanet::io::MappedFile::open(&f).expect("open");
    let pf = file.parse().expect("parse");
    let opts = deltanet::Options {
        scale: Some(0.25),
        use_qk_l2norm: true,
        chunk_size: 16,
        out_dtype: Some(deltanet::DType::F32),
        output_chunk_states: true,
        ..pf.options.clone()
    };
    let want = deltanet::forward(&deltanet::Device::Cpu, &pf.inputs, &opts).expect("forward");
    assert_eq!(find(&got, "o").3, want.o.as_bytes());
    let h = want.chunk_states.expect("chunk states");
    let (_, dt, shape, bytes) = find(&got, "chunk_states");
    assert_eq!(dt, "F32");
    // T = 77 in chunks of 16: 5 chunks; HV = 3, K = 60, V = 100.
    assert_eq!(shape, &vec![5, 3, 60, 100]);
    assert_eq!(bytes.as_slice(), h.as_bytes());
}

/// A safetensors file from (name, dtype, shape, bytes) entries and metadata.
fn st_bytes(entries: &[(&str, &str, Vec<usize>, Vec<u8>)], meta: &[(&str, &str)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !meta.is_empty() {
        let m: serde_json::Map<String, serde_json::Value> = meta
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(m));
    }
    let mut off = 0;
    for (n, dt, shape, b) in entries {
        header.insert(
            n.to_string(),
            serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [off, off + b.len()]}),
        );
        off += b.len();
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).expect("json");
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    for (_, _, _, b) in entries {
        out.extend(b);
    }
    out
}

fn f32_bytes(n: usize, x: f32) -> Vec<u8> {
    (0..n).flat_map(|_| x.to_le_bytes()).collect()
}

/// A small valid problem: B=1, T=5, H=1, HV=2, K=4, V=3, with some entries replaced.
fn small_problem(
    replace: &[(&str, &str, Vec<usize>, Vec<u8>)],
    drop: &[&str],
    meta: &[(&str, &str)],
) -> Vec<u8> {
    let (t, h, hv, k, v) = (5, 1, 2, 4, 3);
    let mut e: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = vec![
        ("q", "F32", vec![1, t, h, k], f32_bytes(t * h * k, 0.5)),
        ("k", "F32", vec![1, t, h, k], f32_bytes(t * h * k, 0.5)),
        ("v", "F32", vec![1, t, hv, v], f32_bytes(t * hv * v, 1.0)),
        ("g", "F32", vec![1, t, hv], f32_bytes(t * hv, -0.1)),
        ("beta", "F32", vec![1, t, hv], f32_bytes(t * hv, 0.5)),
    ];
    e.retain(|x| !drop.contains(&x.0) && !replace.iter().any(|r| r.0 == x.0));
    e.extend(replace.iter().cloned());
    st_bytes(&e, meta)
}

/// Runs `deltanet run` on `bytes` written to a file; returns the output and the output path.
fn run_on(name: &str, bytes: &[u8], extra: &[&str]) -> (Output, PathBuf, Scratch) {
    let dir = scratch(name);
    let input = dir.join("in.safetensors");
    std::fs::write(&input, bytes).expect("write input");
    let out = dir.join("out.safetensors");
    let mut args = vec![
        "run",
        "--input",
        input.to_str().expect("utf8"),
        "--output",
        out.to_str().expect("utf8"),
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    (deltanet(&args), out, dir)
}

/// Exit 1, one line on stderr naming the file and containing each of `needles`, no panic, no
/// output file, no temporary file left behind.
fn assert_bad_data(name: &str, bytes: &[u8], extra: &[&str], needles: &[&str]) {
    let (o, out, dir) = run_on(name, bytes, extra);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{name}: stderr {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    assert!(
        err.contains("in.safetensors"),
        "{name}: no file name in {err}"
    );
    for n in needles {
        assert!(err.contains(n), "{name}: {n:?} not in {err}");
    }
    assert!(!out.exists(), "{name}: output written on failure");
    let left = files_in(&dir);
    assert_eq!(left.len(), 1, "{name}: files left behind: {left:?}");
}

#[test]
fn the_small_problem_is_valid() {
    let (o, out, _dir) = run_on("valid", &small_problem(&[], &[], &[]), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.exists());
}

#[test]
fn garbage_empty_truncated_and_inconsistent_files() {
    assert_bad_data(
        "garbage",
        b"this is not a safetensors file at all",
        &[],
        &["safetensors"],
    );
    assert_bad_data("empty", b"", &[], &["empty"]);
    assert_bad_data("short", b"\x01\x02", &[], &["safetensors"]);
    let good = small_problem(&[], &[], &[]);
    assert_bad_data("truncated", &good[..good.len() - 7], &[], &["truncated"]);
    assert_bad_data("header_cut", &good[..20], &[], &["header"]);
    // The header promises more data than there is.
    let mut e = vec![("q", "F32", vec![1, 5, 1, 4], f32_bytes(20, 0.5))];
    let mut lying = st_bytes(&e, &[]);
    lying.truncate(lying.len() - 4);
    assert_bad_data("lying", &lying, &[], &["do not match"]);
    // A header length past the end of the file.
    e.clear();
    let mut huge = (1u64 << 40).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    assert_bad_data("huge_header", &huge, &[], &["header"]);
}

#[test]
fn missing_tensor_wrong_dtype_and_rank() {
    assert_bad_data(
        "missing",
        &small_problem(&[], &["beta"], &[]),
        &[],
        &["beta", "got none"],
    );
    assert_bad_data(
        "dtype",
        &small_problem(
            &[("q", "I32", vec![1, 5, 1, 4], f32_bytes(20, 0.5))],
            &[],
            &[],
        ),
        &[],
        &["q", "dtype"],
    );
    assert_bad_data(
        "rank",
        &small_problem(&[("q", "F32", vec![5, 1, 4], f32_bytes(20, 0.5))], &[], &[]),
        &[],
        &["q", "rank 4"],
    );
    assert_bad_data(
        "shape",
        &small_problem(
            &[("g", "F32", vec![1, 5, 3], f32_bytes(15, -0.1))],
            &[],
            &[],
        ),
        &[],
        &["g", "[1, 5, 2]"],
    );
}

#[test]
fn hv_not_a_multiple_of_h() {
    // H = 2, HV = 3.
    let bytes = small_problem(
        &[
            ("q", "F32", vec![1, 5, 2, 4], f32_bytes(40, 0.5)),
            ("k", "F32", vec![1, 5, 2, 4], f32_bytes(40, 0.5)),
            ("v", "F32", vec![1, 5, 3, 3], f32_bytes(45, 1.0)),
            ("g", "F32", vec![1, 5, 3], f32_bytes(15, -0.1)),
            ("beta", "F32", vec![1, 5, 3], f32_bytes(15, 0.5)),
        ],
        &[],
        &[],
    );
    assert_bad_data("hv", &bytes, &[], &["multiple of H", "HV = 3"]);
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn bad_cu_seqlens() {
    for (name, cu) in [
        ("cu_start", vec![1i64, 5]),
        ("cu_decreasing", vec![0, 3, 2, 5]),
        ("cu_past_t", vec![0, 2, 9]),
    ] {
        let n = cu.len();
        let bytes = small_problem(&[("cu_seqlens", "I64", vec![n], i64_bytes(&cu))], &[], &[]);
        assert_bad_data(name, &bytes, &[], &["cu_seqlens"]);
    }
    // I32 offsets are accepted.
    let cu32: Vec<u8> = [0i32, 2, 5].iter().flat_map(|x| x.to_le_bytes()).collect();
    let (o, out, _dir) = run_on(
        "cu_i32",
        &small_problem(&[("cu_seqlens", "I32", vec![3], cu32)], &[], &[]),
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(find(&read_st(&out), "final_state").2, vec![2, 2, 4, 3]);
}

#[test]
fn gate_in_kernel_without_a_log_and_bad_metadata() {
    assert_bad_data(
        "gate",
        &small_problem(&[], &[], &[("gate_in_kernel", "true")]),
        &[],
        &["A_log"],
    );
    // The same through the flag.
    assert_bad_data(
        "gate_flag",
        &small_problem(&[], &[], &[]),
        &["--gate-in-kernel"],
        &["A_log"],
    );
    assert_bad_data(
        "scale_text",
        &small_problem(&[], &[], &[("scale", "\"abc\"")]),
        &[],
        &["scale", "number"],
    );
    assert_bad_data(
        "scale_not_json",
        &small_problem(&[], &[], &[("scale", "fast")]),
        &[],
        &["scale"],
    );
    assert_bad_data(
        "chunk_meta",
        &small_problem(&[], &[], &[("chunk_size", "48")]),
        &[],
        &["chunk_size", "16, 32 or 64"],
    );
    // Unknown keys are ignored.
    let (o, _, _) = run_on(
        "case_key",
        &small_problem(&[], &[], &[("case", "whatever"), ("head_map", "\"tiled\"")]),
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn shapes_too_large_to_allocate() {
    // K = V = 100000: the inputs are small, the state alone is 40 GB.
    let n = 100_000;
    let bytes = small_problem(
        &[
            ("q", "F32", vec![1, 1, 1, n], f32_bytes(n, 0.0)),
            ("k", "F32", vec![1, 1, 1, n], f32_bytes(n, 0.0)),
            ("v", "F32", vec![1, 1, 1, n], f32_bytes(n, 0.0)),
            ("g", "F32", vec![1, 1, 1], f32_bytes(1, 0.0)),
            ("beta", "F32", vec![1, 1, 1], f32_bytes(1, 0.0)),
        ],
        &[],
        &[],
    );
    assert_bad_data("huge", &bytes, &[], &["too large"]);
}

#[test]
fn existing_output_is_not_clobbered_on_failure() {
    let dir = scratch("clobber");
    let input = dir.join("in.safetensors");
    std::fs::write(&input, small_problem(&[], &["v"], &[])).expect("write");
    let out = dir.join("out.safetensors");
    std::fs::write(&out, b"precious").expect("write");
    let o = deltanet(&argv("run --input {} --output {}", &[&input, &out]));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(std::fs::read(&out).expect("read"), b"precious");
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 2);

    // A successful run replaces it.
    std::fs::write(&input, small_problem(&[], &[], &[])).expect("write");
    let o = deltanet(&argv("run --input {} --output {}", &[&input, &out]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(find(&read_st(&out), "o").2, vec![1, 5, 2, 3]);
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 2);
}

#[test]
fn missing_input_and_output_folder() {
    let dir = scratch("missing");
    let o = deltanet(&argv(
        "run --input {} --output {}",
        &[&dir.join("nope.safetensors"), &dir.join("out.safetensors")],
    ));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nope.safetensors"), "{}", stderr(&o));
    let f = vectors_dir().join("odd_dims.safetensors");
    let o = deltanet(&[
        "run",
        "--input",
        f.to_str().expect("utf8"),
        "--output",
        dir.join("no/such/dir/out.safetensors")
            .to_str()
            .expect("utf8"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

#[test]
fn usage_errors_exit_2() {
    let f = vectors_dir().join("odd_dims.safetensors");
    let f = f.to_str().expect("utf8");
    for args in [
        vec!["run"],
        vec!["run", "--input", f],
        vec!["frobnicate"],
        vec![
            "run",
            "-i",
            f,
            "-o",
            "/tmp/x.safetensors",
            "--device",
            "gpu",
        ],
        vec![
            "run",
            "-i",
            f,
            "-o",
            "/tmp/x.safetensors",
            "--chunk-size",
            "48",
        ],
        vec!["run", "-i", f, "-o", "/tmp/x.safetensors", "--scale", "abc"],
        vec![
            "run",
            "-i",
            f,
            "-o",
            "/tmp/x.safetensors",
            "--out-dtype",
            "f64",
        ],
        vec!["bench", "--shape", "1,2,3"],
        vec!["bench", "--shape", "1,64,2,3,4,4"],
        vec!["selftest", "--count", "many"],
    ] {
        let o = deltanet(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"));
    }
    let o = deltanet(&["--help"]);
    assert!(o.status.success());
    for cmd in ["run", "demo", "bench", "selftest"] {
        assert!(stdout(&o).contains(cmd), "help lacks {cmd}");
    }
}

#[test]
fn selftest_on_cpu_passes() {
    let Some(v) = shared_vectors("selftest_on_cpu_passes") else {
        return;
    };
    let o = deltanet(&argv(
        "selftest --device cpu --count 4 --seed 3 --vectors {}",
        &[&v],
    ));
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    let last = out.trim_end().lines().last().expect("a last line");
    let (passed, rest) = last.split_once(" passed, ").expect("N passed, M failed");
    assert!(passed.parse::<usize>().expect("count") > 50, "{last}");
    assert_eq!(rest, "0 failed");
    assert!(out.contains("vector varlen_f32.safetensors: forward o"));
}

#[test]
fn selftest_reports_failures_with_exit_1() {
    // A vectors folder with a broken file: that check fails, the suite exits 1.
    let dir = scratch("selftest_fail");
    std::fs::write(dir.join("broken.safetensors"), b"garbage").expect("write");
    let o = deltanet(&argv(
        "selftest --device cpu --count 0 --vectors {}",
        &[&dir],
    ));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).trim_end().ends_with("0 passed, 1 failed"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn bench_writes_json() {
    let dir = scratch("bench");
    let json = dir.join("bench.json");
    let o = deltanet(&argv(
        "bench --device cpu --shape 2,100,2,4,16,8 --dtype f16 --repeats 3 --json {}",
        &[&json],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json file")).expect("valid JSON");
    let results = v["results"].as_array().expect("results");
    let works: Vec<&str> = results.iter().filter_map(|r| r["work"].as_str()).collect();
    assert_eq!(works, ["prefill", "solve_tril", "decode"]);
    for r in results {
        assert_eq!(r["times_ms"].as_array().map(Vec::len), Some(3));
        assert!(r["median_ms"].as_f64().is_some_and(|m| m >= 0.0));
    }
    assert!(results[0]["tokens_per_s"].as_f64().is_some_and(|x| x > 0.0));
    assert!(results[1]["bytes_per_s"].as_f64().is_some_and(|x| x > 0.0));
    assert_eq!(v["shape"]["T"], 100);
    assert!(stdout(&o).contains("median ms"));
}

#[test]
fn demo_runs_and_checks_itself() {
    let o = deltanet(&["demo", "--device", "cpu", "--tokens", "256"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("tokens/s") && out.contains("rel err"), "{out}");
}

#[test]
fn segmented_runs_match_whole_runs() {
    if shared_vectors("segmented_runs_match_whole_runs").is_none() {
        return;
    }
    let dir = scratch("segments");
    for f in vector_files() {
        let whole = dir.join("whole.safetensors");
        let parts = dir.join("parts.safetensors");
        for (out, seg) in [(&whole, "1000000"), (&parts, "100")] {
            let o = deltanet(&[
                "run",
                "--input",
                f.to_str().expect("utf8"),
                "--output",
                out.to_str().expect("utf8"),
                "--out-dtype",
                "f32",
                "--device",
                "cpu",
                "--chunk-size",
                "32",
                "--intermediate-states",
                "--segment-tokens",
                seg,
            ]);
            assert!(o.status.success(), "{}: {}", f.display(), stderr(&o));
        }
        let (w, p) = (read_st(&whole), read_st(&parts));
        for name in ["o", "final_state", "chunk_states"] {
            let (a, b) = (find(&w, name), find(&p, name));
            assert_eq!(a.2, b.2, "{}: {name} shape", f.display());
            let b64: Vec<f64> = f32s(&b.3).iter().map(|&x| x as f64).collect();
            let e = rel_l2(&f32s(&a.3), &b64);
            assert!(e <= 1e-6, "{}: {name} differs by {e:e}", f.display());
        }
    }
}

#[test]
fn segment_plans_tile_the_tokens_at_chunk_boundaries() {
    use deltanet::selftest::Rng;
    let mut rng = Rng::new(5);
    for _ in 0..300 {
        let t = rng.int(0, 400);
        let n = rng.int(1, 6);
        let mut cu: Vec<i64> = (0..n - 1).map(|_| rng.int(0, t) as i64).collect();
        cu.push(0);
        cu.push(t as i64);
        cu.sort_unstable();
        let opts = deltanet::Options {
            chunk_size: [16, 32, 64][rng.int(0, 2)],
            ..deltanet::Options::default()
        };
        let p = deltanet::Problem::new(
            deltanet::Dims {
                batch: 1,
                seq_len: t,
                heads: 1,
                v_heads: 1,
                dk: 2,
                dv: 2,
            },
            Some(&cu),
            &opts,
        )
        .expect("problem");
        let max = rng.int(1, 200);
        let plan = deltanet::io::plan_segments(&p, max);
        let bt = opts.chunk_size;
        let cap = (max / bt).max(1) * bt;
        let mut next = 0;
        let mut pieces_per_seq = vec![0usize; p.num_seqs()];
        for seg in &plan {
            let len: usize = seg.iter().map(|pc| pc.hi - pc.lo).sum();
            assert!(len <= cap, "segment of {len} > {cap}");
            for pc in seg {
                assert_eq!(pc.lo, next, "pieces must be contiguous");
                let (s, e) = p.seqs()[pc.n];
                assert!(s <= pc.lo && pc.hi <= e);
                assert!(pc.lo == s || (pc.lo - s) % bt == 0, "cut inside a chunk");
                next = pc.hi;
                pieces_per_seq[pc.n] += 1;
            }
        }
        assert_eq!(next, t);
        assert!(
            pieces_per_seq.iter().all(|&c| c >= 1),
            "a sequence is missing"
        );
    }
}

#[test]
fn flags_can_turn_metadata_options_off() {
    let seed = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/bf16.safetensors");
    let dir = scratch("flags_off");
    let out = dir.join("o.safetensors");
    let o = deltanet(&[
        "run",
        "-i",
        seed,
        "-o",
        out.to_str().expect("utf8"),
        "--device",
        "cpu",
        "--use-qk-l2norm",
        "false",
        "--scale",
        "null",
        "--head-map",
        "grouped",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).expect("read");
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("header");
    let meta = meta.metadata().clone().expect("metadata");
    // The file says l2norm on, scale 0.3, tiled, chunk 16; the flags win where given.
    assert_eq!(meta["use_qk_l2norm"], "false");
    assert_eq!(meta["scale"], "null");
    assert_eq!(meta["head_map"], "\"grouped\"");
    assert_eq!(meta["chunk_size"], "16");
}

#[test]
fn unknown_tensor_names_are_refused() {
    // A misspelt initial state would otherwise be dropped silently.
    let typo = (
        "initial_states",
        "F32",
        vec![1, 2, 4, 3],
        f32_bytes(24, 1.0),
    );
    assert_bad_data(
        "typo",
        &small_problem(&[typo], &[], &[]),
        &[],
        &["tensor initial_states", "unknown name"],
    );
}

#[test]
fn output_must_be_a_regular_file_other_than_the_input() {
    let dir = scratch("special-output");
    let input = dir.join("in.safetensors");
    let bytes = small_problem(&[], &[], &[]);
    std::fs::write(&input, &bytes).expect("write input");
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let inp = input.to_str().expect("utf8");
    let o = deltanet(&[
        "run",
        "-i",
        inp,
        "-o",
        fifo.to_str().expect("utf8"),
        "--device",
        "cpu",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("special file"), "{}", stderr(&o));
    let o = deltanet(&["run", "-i", inp, "-o", inp, "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("the input itself"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(&input).expect("read input"),
        bytes,
        "input changed"
    );
}

#[test]
fn a_failed_rename_leaves_nothing_behind() {
    // The output names a folder path that does not exist below an existing file: the data is
    // computed and written to the temporary file, then the final step fails.
    let dir = scratch("failed-rename");
    let input = dir.join("in.safetensors");
    std::fs::write(&input, small_problem(&[], &[], &[])).expect("write input");
    let out = format!("{}/", dir.join("out.safetensors").display());
    let o = deltanet(&[
        "run",
        "-i",
        input.to_str().expect("utf8"),
        "-o",
        &out,
        "--device",
        "cpu",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    let left = files_in(&dir);
    assert_eq!(left.len(), 1, "files left behind: {left:?}");
}

#[test]
fn usage_errors_are_one_line() {
    for args in [
        &["run"][..],
        &["run", "--bogus"],
        &["bench", "--dtype", "f64"],
        &["frobnicate"],
    ] {
        let o = deltanet(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
}

/// Waits for `child` at most `secs` seconds; a child still running then is killed and the test
/// fails (the command hung).
fn wait_at_most(mut child: std::process::Child, secs: u64, what: &str) -> Output {
    let t0 = std::time::Instant::now();
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if t0.elapsed().as_secs() >= secs => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what}: still running after {secs} s");
            }
            None => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

/// The words of `line`, each `{}` replaced by the next of `paths`.
fn argv(line: &str, paths: &[&Path]) -> Vec<std::ffi::OsString> {
    let mut paths = paths.iter();
    line.split_whitespace()
        .map(|w| match w {
            "{}" => paths.next().expect("a path per {}").as_os_str().to_owned(),
            _ => w.into(),
        })
        .collect()
}

fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Child {
    use std::process::Stdio;
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the deltanet binary")
}

/// Elements with these bits (f32 by `to_bits`, bf16 or f16 as u16) at the given flat indices.
fn with_bits<T: Copy>(
    n: usize,
    fill: T,
    at: &[(usize, T)],
    bytes: impl Fn(T) -> Vec<u8>,
) -> Vec<u8> {
    let mut v = vec![fill; n];
    for &(i, x) in at {
        v[i] = x;
    }
    v.into_iter().flat_map(bytes).collect()
}

#[test]
fn non_finite_inputs_are_refused_naming_tensor_and_index() {
    let f32b = |x: f32| x.to_le_bytes().to_vec();
    // small_problem: B=1, T=5, H=1, HV=2, K=4, V=3.
    // k [1, 5, 1, 4]: flat 13 is t=3, d=1.
    let k = with_bits(20, 0.5f32, &[(13, f32::NAN)], f32b);
    assert_bad_data(
        "nan_k",
        &small_problem(&[("k", "F32", vec![1, 5, 1, 4], k)], &[], &[]),
        &[],
        &[
            "tensor k",
            "NaN at flat index 13",
            "[b, t, h, d] = [0, 3, 0, 1]",
            "--allow-non-finite",
        ],
    );
    // v [1, 5, 2, 3]: flat 29 is t=4, h=1, d=2; the first bad value is named.
    let v = with_bits(30, 1.0f32, &[(29, f32::INFINITY)], f32b);
    assert_bad_data(
        "inf_v",
        &small_problem(&[("v", "F32", vec![1, 5, 2, 3], v)], &[], &[]),
        &[],
        &["tensor v", "inf at flat index 29", "[0, 4, 1, 2]"],
    );
    // beta [1, 5, 2]: -inf is refused there; g [1, 5, 2]: +inf and NaN are, -inf is a hard reset.
    let beta = with_bits(10, 0.5f32, &[(3, f32::NEG_INFINITY)], f32b);
    assert_bad_data(
        "neg_inf_beta",
        &small_problem(&[("beta", "F32", vec![1, 5, 2], beta)], &[], &[]),
        &[],
        &[
            "tensor beta",
            "-inf at flat index 3",
            "[b, t, h] = [0, 1, 1]",
        ],
    );
    let g = with_bits(10, -0.1f32, &[(6, f32::INFINITY)], f32b);
    assert_bad_data(
        "inf_g",
        &small_problem(&[("g", "F32", vec![1, 5, 2], g)], &[], &[]),
        &[],
        &["tensor g", "inf at flat index 6"],
    );
    let g = with_bits(10, -0.1f32, &[(6, f32::NEG_INFINITY)], f32b);
    let (o, out, _dir) = run_on(
        "reset_g",
        &small_problem(&[("g", "F32", vec![1, 5, 2], g)], &[], &[]),
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.exists());
    // q in bf16 and f16 (k, v alike): a NaN at flat 5 (t=1, d=1).
    let u16b = |x: u16| x.to_le_bytes().to_vec();
    for (dt, half, nan) in [("BF16", 0x3f00u16, 0x7fc0u16), ("F16", 0x3800, 0x7e00)] {
        let q = with_bits(20, half, &[(5, nan)], u16b);
        let k = with_bits(20, half, &[], u16b);
        let v = with_bits(30, half, &[], u16b);
        let bytes = small_problem(
            &[
                ("q", dt, vec![1, 5, 1, 4], q),
                ("k", dt, vec![1, 5, 1, 4], k),
                ("v", dt, vec![1, 5, 2, 3], v),
            ],
            &[],
            &[],
        );
        assert_bad_data(
            dt,
            &bytes,
            &[],
            &["tensor q", "NaN at flat index 5", "[0, 1, 0, 1]"],
        );
        // The flag skips the check.
        let (o, out, _dir) = run_on(&format!("{dt}_allowed"), &bytes, &["--allow-non-finite"]);
        assert!(o.status.success(), "{dt}: {}", stderr(&o));
        assert!(out.exists());
    }
    // A state: checked once, up front.
    let h0 = with_bits(24, 0.0f32, &[(23, f32::NAN)], f32b);
    assert_bad_data(
        "nan_state",
        &small_problem(&[("initial_state", "F32", vec![1, 2, 4, 3], h0)], &[], &[]),
        &[],
        &[
            "tensor initial_state",
            "flat index 23",
            "[n, h, k, v] = [0, 1, 3, 2]",
        ],
    );
}

#[test]
fn non_finite_values_in_a_later_segment_stop_the_run_without_output() {
    // T = 200 in segments of 16 tokens; the NaN sits in token 150's v.
    let (t, hv, v) = (200, 2, 3);
    let f32b = |x: f32| x.to_le_bytes().to_vec();
    let bytes = st_bytes(
        &[
            ("q", "F32", vec![1, t, 1, 4], f32_bytes(t * 4, 0.5)),
            ("k", "F32", vec![1, t, 1, 4], f32_bytes(t * 4, 0.5)),
            (
                "v",
                "F32",
                vec![1, t, hv, v],
                with_bits(t * hv * v, 1.0f32, &[(150 * hv * v + 4, f32::NAN)], f32b),
            ),
            ("g", "F32", vec![1, t, hv], f32_bytes(t * hv, -0.1)),
            ("beta", "F32", vec![1, t, hv], f32_bytes(t * hv, 0.5)),
        ],
        &[],
    );
    assert_bad_data(
        "late_nan",
        &bytes,
        &["--chunk-size", "16", "--segment-tokens", "16"],
        &["tensor v", "[0, 150, 1, 1]"],
    );
}

#[test]
fn a_fifo_as_input_is_refused_without_blocking() {
    let dir = scratch("fifo-input");
    let fifo = dir.join("in.safetensors");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let out = dir.join("out.safetensors");
    let child = spawn(&argv("run -i {} -o {} --device cpu", &[&fifo, &out]));
    let o = wait_at_most(child, 60, "run on a FIFO");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("expected a regular file, got a FIFO"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
}

#[test]
fn bench_checks_its_json_path_before_benchmarking() {
    let dir = scratch("bench-json-missing");
    let json = dir.join("no/such/folder/bench.json");
    // Thousands of timed runs of a 4096-token prefill: minutes, were they run first.
    let child = spawn(&argv(
        "bench --device cpu --shape 1,4096,2,2,64,64 --repeats 100000 --json {}",
        &[&json],
    ));
    let o = wait_at_most(child, 60, "bench with a --json path in a missing folder");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("no/such/folder"), "{}", stderr(&o));
    assert!(stderr(&o).contains("existing folder"), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
}

#[test]
fn a_closed_stdout_ends_quietly() {
    use std::io::BufRead;
    for args in [
        "selftest --device cpu --count 20",
        "demo --device cpu --tokens 512",
    ] {
        let mut child = spawn(&argv(args, &[]));
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        lines.read_line(&mut first).expect("a first line");
        assert!(!first.is_empty(), "{args:?}");
        // Like `| head -1`: the reader goes away.
        drop(lines);
        let o = wait_at_most(child, 300, "a command with its stdout closed");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(141), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

/// A run of about a second on a 2-core machine (T = 2000, HV = 2, K = V = 512 in 125 segments),
/// stopped with SIGSTOP once its temporary output exists. Returns the child and the folder.
fn stopped_mid_run(name: &str) -> (std::process::Child, Scratch) {
    let (t, hv, k) = (2000, 2, 512);
    let bytes = st_bytes(
        &[
            ("q", "F32", vec![1, t, 1, k], f32_bytes(t * k, 0.05)),
            ("k", "F32", vec![1, t, 1, k], f32_bytes(t * k, 0.05)),
            ("v", "F32", vec![1, t, hv, k], f32_bytes(t * hv * k, 1.0)),
            ("g", "F32", vec![1, t, hv], f32_bytes(t * hv, -0.1)),
            ("beta", "F32", vec![1, t, hv], f32_bytes(t * hv, 0.5)),
        ],
        &[],
    );
    let dir = scratch(name);
    let input = dir.join("in.safetensors");
    std::fs::write(&input, bytes).expect("write input");
    let out = dir.join("out.safetensors");
    let mut child = spawn(&argv(
        "run -i {} -o {} --device cpu --chunk-size 16 --segment-tokens 16",
        &[&input, &out],
    ));
    let t0 = std::time::Instant::now();
    loop {
        let temp = std::fs::read_dir(&dir).expect("read dir").any(|e| {
            e.expect("entry")
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")
        });
        if temp {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
            return (child, dir);
        }
        if let Some(st) = child.try_wait().expect("wait") {
            panic!("{name}: the run ended ({st}) before its temporary file was seen");
        }
        assert!(t0.elapsed().as_secs() < 120, "{name}: no temporary file");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn signals_end_a_run_with_their_codes_and_no_temporary_file() {
    for (sig, code, name) in [
        (libc::SIGTERM, 143, "sigterm"),
        (libc::SIGINT, 130, "sigint"),
        (libc::SIGHUP, 129, "sighup"),
        (libc::SIGBUS, 1, "sigbus"),
    ] {
        let (child, dir) = stopped_mid_run(name);
        // SAFETY: kill(2) on our own child's pid; the signal waits until it continues.
        unsafe {
            libc::kill(child.id() as i32, sig);
            libc::kill(child.id() as i32, libc::SIGCONT);
        }
        let o = wait_at_most(child, 60, name);
        assert_eq!(o.status.code(), Some(code), "{name}: {}", stderr(&o));
        assert_eq!(files_in(&dir), ["in.safetensors"], "{name}");
        if sig == libc::SIGBUS {
            assert!(stderr(&o).contains("while being read"), "{}", stderr(&o));
        }
    }
}

#[test]
fn an_input_truncated_during_a_run_stops_it_without_output() {
    let (child, dir) = stopped_mid_run("truncated-input");
    let input = dir.join("in.safetensors");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .expect("open input");
    let len = f.metadata().expect("stat").len();
    f.set_len(len / 2).expect("truncate");
    drop(f);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    let o = wait_at_most(child, 60, "run on a truncated input");
    let err = stderr(&o);
    // Either the check between segments sees it, or a read of a lost page faults (SIGBUS).
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("while being read"), "{err}");
    assert_eq!(files_in(&dir), ["in.safetensors"]);
}

/// A problem of `t` tokens with varied values: B=1, H=2, HV=4, K=16, V=8.
fn varied_problem(t: usize) -> Vec<u8> {
    let wave = |n: usize, f: f32, a: f32, b: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (a + b * (i as f32 * f).sin()).to_le_bytes())
            .collect()
    };
    st_bytes(
        &[
            ("q", "F32", vec![1, t, 2, 16], wave(t * 32, 0.37, 0.0, 1.0)),
            ("k", "F32", vec![1, t, 2, 16], wave(t * 32, 0.71, 0.0, 0.3)),
            ("v", "F32", vec![1, t, 4, 8], wave(t * 32, 0.13, 0.0, 1.0)),
            ("g", "F32", vec![1, t, 4], wave(t * 4, 0.9, -0.2, 0.1)),
            ("beta", "F32", vec![1, t, 4], wave(t * 4, 0.5, 0.5, 0.4)),
        ],
        &[],
    )
}

#[test]
fn a_problem_that_fits_is_one_segment_and_counts_are_singular() {
    // T = 77 is more than one chunk of 64 but fits the default segment.
    let (o, _, _) = run_on("t77", &varied_problem(77), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("(1 sequence, 1 segment)"),
        "{}",
        stderr(&o)
    );
    // Cut on purpose: plural.
    let (o, _, _) = run_on("t77-cut", &varied_problem(77), &["--segment-tokens", "64"]);
    assert!(
        stderr(&o).contains("(1 sequence, 2 segments)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_output_file_is_a_function_of_the_inputs() {
    let dir = scratch("threads");
    let input = dir.join("in.safetensors");
    std::fs::write(&input, varied_problem(300)).expect("write input");
    let mut files = Vec::new();
    for threads in ["1", "2", "2"] {
        let out = dir.join(format!("out-{}.safetensors", files.len()));
        let o = Command::new(BIN)
            .args(["run", "-i", input.to_str().expect("utf8"), "-o"])
            .arg(&out)
            .args(["--device", "cpu", "--intermediate-states"])
            .env("RAYON_NUM_THREADS", threads)
            .output()
            .expect("run");
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("cpu ({threads} thread")),
            "{}",
            stderr(&o)
        );
        files.push(std::fs::read(&out).expect("read output"));
    }
    assert!(files[0] == files[1], "1 and 2 threads give different files");
    assert!(files[1] == files[2], "two runs give different files");
}

#[test]
fn selftest_refuses_to_check_nothing() {
    let o = deltanet(&["selftest", "--device", "cpu", "--count", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--count"), "{}", stderr(&o));
    // An empty vectors folder and no random problems: a failed check, not a vacuous pass.
    let dir = scratch("selftest-empty");
    let child = spawn(&argv(
        "selftest --device cpu --count 0 --vectors {}",
        &[&dir],
    ));
    let o = wait_at_most(child, 60, "selftest on an empty folder");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).contains("0 passed, 1 failed"), "{}", stdout(&o));
}

#[test]
fn a_header_over_the_safetensors_limit_says_so() {
    let mut bytes = 200_000_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}      ");
    assert_bad_data("big_header", &bytes, &[], &["100 MB", "200000000 bytes"]);
}

#[test]
fn bench_varlen_and_prefill_flops() {
    let dir = scratch("bench-varlen");
    let json = dir.join("bench.json");
    let o = wait_at_most(
        spawn(&argv(
            "bench --device cpu --shape 1,300,2,4,16,8 --varlen 5 --work prefill --repeats 2 --json {}",
            &[&json],
        )),
        300,
        "bench --varlen",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("T=300 in 5 sequences"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("FLOP/s"), "{}", stdout(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json file")).expect("valid JSON");
    assert_eq!(v["varlen"], 5);
    let r = &v["results"][0];
    assert_eq!(r["work"], "prefill");
    assert!(r["flops"].as_f64().is_some_and(|f| f > 0.0), "{r}");
    assert!(r["flops_per_s"].as_f64().is_some_and(|f| f > 0.0), "{r}");
    // Varlen packs one batch row.
    let o = deltanet(&["bench", "--shape", "2,300,2,4,16,8", "--varlen", "5"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("B = 1"), "{}", stderr(&o));
}

/// `--precision` on selftest and demo: named in the output, checked at the same bounds, and a
/// bad value is a usage error naming the flag.
#[test]
fn selftest_and_demo_take_precision() {
    let o = deltanet(&[
        "selftest",
        "--device",
        "cpu",
        "--count",
        "2",
        "--precision",
        "fast",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("fast precision"), "{}", stdout(&o));
    let o = deltanet(&[
        "demo",
        "--device",
        "cpu",
        "--tokens",
        "65",
        "--precision",
        "fast",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("fast precision") && stdout(&o).contains("ok"));
    let o = deltanet(&["selftest", "--device", "cpu", "--precision", "fastest"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--precision") && stderr(&o).contains("exact or fast"));
}

/// `deltanet plot` draws the bench and anchors JSON files as an SVG: one line per series,
/// named in the legend; bad files and names are refused with the file named.
#[test]
fn plot_draws_bench_and_anchor_files() {
    let dir = scratch("plot");
    let mut files = Vec::new();
    for (t, precision) in [(64, "exact"), (130, "exact"), (64, "fast")] {
        let f = dir.join(format!("bench_{t}_{precision}.json"));
        let o = deltanet(&[
            "bench",
            "--device",
            "cpu",
            "--work",
            "prefill",
            "--dtype",
            "bf16",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--shape",
            &format!("1,{t},2,4,16,16"),
            "--precision",
            precision,
            "--json",
            f.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        files.push(f);
    }
    let anchors = dir.join("fla.json");
    std::fs::write(
        &anchors,
        r#"[{"impl": "fla", "work": "prefill", "B": 1, "T": 64, "H": 2, "HV": 4, "K": 16, "V": 16, "ms": 0.5},
            {"impl": "fla", "work": "prefill", "B": 1, "T": 130, "H": 2, "HV": 4, "K": 16, "V": 16, "ms": 0.6},
            {"impl": "fla", "work": "decode", "N": 1, "HV": 4, "H": 2, "K": 16, "V": 16, "ms": 0.1}]"#,
    )
    .unwrap();
    files.push(anchors);
    let svg = dir.join("plot.svg");
    let mut args = vec![
        "plot".to_string(),
        "--out".into(),
        svg.to_str().unwrap().into(),
    ];
    args.extend(files.iter().map(|f| f.to_str().unwrap().to_string()));
    let o = deltanet(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("deltanet exact: 2 points") && stdout(&o).contains("fla: 2 points")
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    for name in [
        "deltanet exact",
        "deltanet fast",
        "fla",
        "prefill time per token (ns)",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
    // A marker per point: 2 + 1 of deltanet, 2 of FLA (its decode row is left out).
    assert_eq!(text.matches("<circle").count(), 5);

    let o = deltanet(&[
        "plot",
        "--out",
        dir.join("plot.png").to_str().unwrap(),
        files[0].to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A file that is not JSON, and one with no prefill measurement: bad data, named.
    for (name, content, needle) in [
        ("bad.json", "not json", "bad.json: not JSON"),
        ("none.json", "[]", "no prefill measurements"),
    ] {
        let f = dir.join(name);
        std::fs::write(&f, content).unwrap();
        let o = deltanet(&["plot", "--out", svg.to_str().unwrap(), f.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains(needle), "{}", stderr(&o));
    }
    // Points no log axis can hold (a zero time, T or B): refused, not drawn (plotters' log
    // scale does not end on such a range).
    for (i, (b, t, ms)) in [(1, 64, "0"), (1, 0, "0.5"), (0, 64, "0.5"), (1, 64, "-1")]
        .into_iter()
        .enumerate()
    {
        let f = dir.join(format!("zero{i}.json"));
        std::fs::write(
            &f,
            format!(
                r#"[{{"impl": "fla", "work": "prefill", "B": {b}, "T": {t}, "H": 2, "HV": 4, "K": 16, "V": 16, "ms": {ms}}}]"#
            ),
        )
        .unwrap();
        let o = wait_at_most(
            spawn(&argv("plot --out {} {}", &[&svg, &f])),
            60,
            "plot of a zero point",
        );
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("a positive finite time"),
            "{}",
            stderr(&o)
        );
    }
}

/// `bench --ranks N`: the prefill split among N ranks beside the plain forward (rows and the
/// speed-up line), and the refusals (B > 1, a work other than the prefill, N < 2).
#[test]
fn bench_ranks_times_the_split_prefill() {
    let dir = scratch("bench-ranks");
    let json = dir.join("bench.json");
    let o = wait_at_most(
        spawn(&argv(
            "bench --device cpu --shape 1,300,2,4,16,8 --varlen 3 --work prefill --ranks 3 --repeats 2 --warmup 0 --json {}",
            &[&json],
        )),
        300,
        "bench --ranks",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("3 ranks on the CPU"), "{out}");
    assert!(
        out.contains("prefill ranks") && out.contains("rank exchange"),
        "{out}"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json file")).expect("valid JSON");
    let works: Vec<&str> = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|r| r["work"].as_str())
        .collect();
    assert_eq!(
        works,
        ["prefill", "prefill host", "prefill ranks", "rank exchange"]
    );
    for (args, needle) in [
        ("bench --shape 2,300,2,4,16,8 --ranks 2", "B = 1"),
        (
            "bench --shape 1,300,2,4,16,8 --work decode --ranks 2",
            "--work prefill",
        ),
        ("bench --shape 1,300,2,4,16,8 --ranks 1", "--ranks"),
        (
            "bench --device cpu --shape 1,300,2,4,16,8 --ranks 2 --exchange nccl",
            "--exchange nccl",
        ),
        (
            "bench --shape 1,300,2,4,16,8 --ranks 2 --exchange mpi",
            "--exchange",
        ),
    ] {
        let o = deltanet(&args.split(' ').collect::<Vec<_>>());
        assert_eq!(o.status.code(), Some(2), "{args}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args}: {}", stderr(&o));
    }
}

/// `bench --work decode --pool N`: a pool that i32 indices cannot name, or that the memory cannot
/// hold, is refused by name before anything is allocated (not an abort, not a wrapped size).
#[test]
fn bench_decode_refuses_pools_it_cannot_hold() {
    for (pool, shape, code, needle) in [
        (
            "3000000000",
            "1,16,1,1,4,4",
            2,
            "--pool: at most 2147483647 rows",
        ),
        ("4611686018427387905", "1,16,1,1,2,2", 2, "--pool: at most"),
        (
            "2000000000",
            "1,16,2,4,128,128",
            1,
            "--pool: too large to allocate",
        ),
    ] {
        let o = wait_at_most(
            spawn(&argv(
                &format!(
                    "bench --device cpu --work decode --repeats 1 --warmup 0 --shape {shape} --pool {pool}"
                ),
                &[],
            )),
            60,
            "bench with a huge pool",
        );
        assert_eq!(o.status.code(), Some(code), "{pool}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{pool}: {}", stderr(&o));
    }
}

/// `DELTANET_CPU_ISA` lowers the CPU kernels' instruction set (named in the run's device line)
/// and every set gives the same outputs to rounding (chunks of 32 without AVX-512).
#[test]
fn every_cpu_instruction_set_gives_the_same_outputs() {
    let dir = scratch("isa");
    let input = dir.join("in.safetensors");
    std::fs::write(&input, varied_problem(300)).expect("write input");
    let native = deltanet::cpu::instruction_set();
    let mut outs = Vec::new();
    for isa in ["avx512", "avx2", "portable"] {
        let out = dir.join(format!("out-{isa}.safetensors"));
        let o = Command::new(BIN)
            .args(["run", "-i", input.to_str().expect("utf8"), "-o"])
            .arg(&out)
            .args(["--device", "cpu"])
            .env("DELTANET_CPU_ISA", isa)
            .output()
            .expect("run");
        assert!(o.status.success(), "{}", stderr(&o));
        // Lowered where the CPU has more; never raised above what it has.
        let want = match isa {
            "portable" => deltanet::cpu::Isa::Portable,
            "avx2" => native.min(deltanet::cpu::Isa::Avx2),
            _ => native,
        };
        assert!(
            stderr(&o).contains(&format!(", {})", want.name())),
            "{isa}: {}",
            stderr(&o)
        );
        let ts = read_st(&out);
        outs.push((
            isa,
            f32s(&find(&ts, "o").3),
            f32s(&find(&ts, "final_state").3),
        ));
    }
    let rel = |a: &[f32], b: &[f32]| {
        let (mut d, mut n) = (0f64, 0f64);
        for (x, y) in a.iter().zip(b) {
            d += (f64::from(*x) - f64::from(*y)).powi(2);
            n += f64::from(*y).powi(2);
        }
        (d / n).sqrt()
    };
    for (isa, o, s) in &outs[1..] {
        assert_eq!(o.len(), outs[0].1.len());
        let (eo, es) = (rel(o, &outs[0].1), rel(s, &outs[0].2));
        assert!(
            eo <= 1e-5 && es <= 1e-5,
            "{isa}: o {eo:.2e}, final state {es:.2e}"
        );
    }
}
