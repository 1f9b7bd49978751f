//! The input-file path of `deltanet run` on arbitrary bytes: safetensors header parsing, tensor
//! and option extraction, shape validation, and for small enough problems the forward itself.
//! Any panic, abort or hang is a bug; errors are the expected outcome for most inputs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.safetensors");
    let Ok(pf) = deltanet::io::parse(data, path) else {
        return;
    };
    let Ok(p) = pf.problem(path, &pf.options) else {
        return;
    };
    // Running the forward is only affordable on tiny problems; it checks that every shape the
    // validation accepts is one the stages handle without panicking.
    if deltanet::io::forward_bytes(&p, &pf.options) < (4 << 20) {
        let _ = deltanet::forward(&deltanet::Device::Cpu, &pf.inputs, &pf.options);
    }
});
