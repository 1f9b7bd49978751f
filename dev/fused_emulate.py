"""Runs the fused prefill kernels' CUDA source on the CPU: chunk_intra and chunk_recurrent_regs
(plain, split, and on warpgroup products) compiled by g++ with a host shim (threads as lanes;
barriers for __syncthreads, named barriers and the warp- and warpgroup-collective operations;
mma.sync, wgmma (its swizzled shared-memory operand as the shim models it), ldmatrix and
cp.async written out, each cp.async landing only at the wait that covers its group), driven by
fused_emulate_driver.cpp against a float64 recurrence. No GPU needed:
    python3 dev/fused_emulate.py [cases]   (12 by default; needs g++ with C++20)
    EMU_TRI_SKIP=1: the WG_TRI configuration with TRI_SKIP (n = 64 - 16 kb)
    EMU_INTRA=diag,doubling: chunk_intra's row norms from the diagonals, the inverse by doubling
    EMU_INTRA=doubling,mma: the doubling's products on the tensor cores
    EMU_OUT=bf16: o written in bf16 (the recurrent kernel's 16-bit store; every fourth case's o
    2 bytes off 16-byte alignment, which takes the element-by-element store)
    EMU_PINREC=1: p formed in the recurrent kernel (P_IN_REC) in the WG_TRI configurations, a
    second of them with 128 columns (two warpgroups); chunk_intra's diagonals with it
    EMU_PIECES=1: the fast precision's one bf16 piece (the bound then FLA's: 4e-3)
    EMU_CONFS=14,15 python3 dev/fused_emulate.py 17   (only those configurations' cases)
A kernel change can so be checked before device time is spent on it (it is slow: small shapes)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K = os.path.join(root, "src/cuda/kernels")
shim = open(os.path.join(root, "dev/fused_emulate_shim.h")).read()


def replace_asm(src):
    """Every inline-PTX statement of the kernels, as a call into the shim."""
    table = [
        ("mma.sync.aligned.m16n8k8.row.col.f32.tf32", "emu_mma_tf32(c, a, b);"),
        ("mma.sync.aligned.m16n8k16.row.col.f32.bf16", "emu_mma16(c, a, b0, b1, false);"),
        ("mma.sync.aligned.m16n8k16.row.col.f32.f16", "emu_mma16(c, a, b0, b1, true);"),
        ("ldmatrix.sync.aligned.m8n8.x4.trans", "emu_ldsm(r, a, true);"),
        ("ldmatrix.sync.aligned.m8n8.x4.shared", "emu_ldsm(r, a, false);"),
        ("stmatrix.sync.aligned.m8n8.x4.trans", "emu_stsm(a, r);"),
        ("cvta.to.shared.u64", "s = emu_smem_addr(dst);"),
        ("cp.async.cg.shared.global", "emu_cp_async16((unsigned)s, src, valid);"),
        ("cp.async.commit_group", "emu_cp_commit();"),
        ("cp.async.wait_group", "emu_cp_wait(n);"),
        ("cvt.rn.bf16x2.f32", "r = emu_pack_bf16x2(hi, lo);"),
        ("fma.rn.bf16x2", "r = emu_fma_bf16x2(w, 0u, acc);"),
        ("cvt.rn.f16x2.f32", "r = emu_pack_f16x2(hi, lo);"),
        ("cvt.f32.f16", "f = emu_f16_to_f32(x);"),
        ("cvt.rn.bf16.f32", "r = emu_f32_to_bf16(x);"),
        ("cvt.rn.f16.f32", "r = emu_f32_to_f16(x);"),
        ("wgmma.fence", "emu_fence();"),
        ("wgmma.commit_group", "emu_fence();"),
        ("wgmma.wait_group", "emu_fence();"),
        ("fence.proxy.async", "emu_fence();"),
        ("{\\n.reg .pred p;", "emu_wgmma(d, a, desc, TB, NW);"),
        ("{\\n.reg .pred s;", "emu_wgmma_ss(d, da, db, NW);"),
        ("bar.arrive", "emu_bar_arrive(id, n);"),
        ("bar.sync", "emu_bar_sync(id, n);"),
    ]
    out, i = [], 0
    for m in re.finditer(r'\basm\s*(volatile\s*)?\(', src):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(src[j], 0)
            j += 1
        body = src[m.end():j - 1]
        # The statement's semicolon, if it has one (PHASE's #define has none).
        k = j
        while src[k] in " \t":
            k += 1
        j = k if src[k] == ";" else j - 1
        text = re.match(r'\s*"([^"]*)"', body).group(1)
        if text == "":
            rep = ";" if "+l" in body else "emu_fence();"
        else:
            rep = next((r for key, r in table if text.startswith(key)), None)
            assert rep is not None, "no host version of: " + text
        out.append(src[i:m.start()] + rep)
        i = j + 1
    out.append(src[i:])
    return "".join(out)


def unit(kernel, defines, entry):
    src = open(os.path.join(K, "common.cuh")).read() + open(os.path.join(K, "fused/mma.cuh")).read()
    src += open(os.path.join(K, "fused", kernel)).read()
    src = src.replace("extern __shared__ __align__(16) unsigned char smem_raw[];",
                      "unsigned char* smem_raw = emu_smem();")
    src = replace_asm(src).replace('extern "C" __global__', "static __global__")
    # Everything of a unit but its entry point in an anonymous namespace: the units define the
    # same inline helpers over their own shared memory, which must not be merged at link time.
    cut = shim.rindex("#include")
    cut = shim.index("\n", cut) + 1
    return defines + shim[:cut] + "namespace {\n" + shim[cut:] + src + "}\n" + entry


def main():
    cases = sys.argv[1] if len(sys.argv) > 1 else "12"
    tmp = tempfile.mkdtemp(prefix="fused_emulate_")
    out = os.path.join(tmp, "fused_emulate")
    objs = []
    drv = os.path.join(root, "dev/fused_emulate_driver.cpp")
    # One translation unit per kernel configuration (each has its own macros).
    # (K, V, columns a block, output warps, K split between two state warps, two state buffers,
    # the planes in one stage buffer). K = 96 and 80: the update's tiles of h^T not a multiple
    # of 8.
    confs = [(32, 32, 16, 0, 0, 0, 0), (32, 32, 16, 1, 0, 0, 0), (96, 32, 32, 0, 0, 0, 0), (32, 32, 16, 1, 1, 0, 0),
             (80, 32, 32, 1, 0, 0, 0), (64, 48, 16, 1, 0, 0, 0), (64, 48, 16, 1, 1, 0, 0), (32, 32, 32, 1, 1, 0, 0),
             (32, 32, 16, 1, 0, 1, 0), (64, 48, 16, 1, 1, 1, 0), (80, 32, 32, 1, 0, 1, 0), (32, 32, 32, 1, 1, 1, 0),
             (32, 32, 32, 0, 0, 0, 1), (64, 48, 16, 0, 0, 0, 1)]
    # The warpgroup products (WGMMA): K a multiple of 64, 64 or 128 columns a block, the plain
    # kernel without the row skip; the last with its planes in one buffer.
    wg_confs = [(64, 64, 64, 0, 0, 0, 0), (128, 128, 128, 0, 0, 0, 0), (64, 128, 64, 0, 0, 0, 1),
                (128, 64, 64, 0, 0, 0, 1)]
    # WG_TRI (the triangular products on wgmma too) on the last, and, from the environment, its
    # row skip (EMU_TRI_SKIP=1: n = 64 - 16 kb).
    pinrec = os.environ.get("EMU_PINREC", "0") == "1"
    pieces = int(os.environ.get("EMU_PIECES", "3"))
    tri = {len(confs) + 3} | ({len(confs) + 1} if pinrec else set())
    tri_skip = os.environ.get("EMU_TRI_SKIP", "0")
    # chunk_intra's variants (Config::intra_diag, intra_doubling): EMU_INTRA=diag,doubling.
    intra = os.environ.get("EMU_INTRA", "").split(",")
    intra_diag, intra_doubling = int("diag" in intra), int("doubling" in intra)
    intra_mma = int(intra_doubling and "mma" in intra)
    out_t = 1 if os.environ.get("EMU_OUT", "") == "bf16" else 0
    confs = confs + wg_confs
    first_wg = len(confs) - len(wg_confs)
    entries = []
    for n, (dk, dv, vt, split, ksplit, hbuf, late) in enumerate(confs):
        d = (f"#define DK {dk}\n#define DV {dv}\n#define VT {vt}\n#define IN_T 1\n#define FUSED_MMA 1\n"
             f"#define NBUF 2\n#define FUSED_WIDE 0\n#define RTHREADS 256\n#define PLANES 1\n"
             f"#define PIECES {pieces}\n#define SPLIT_OUT {split}\n#define OUT_T {out_t}\n#define KSPLIT {1 + ksplit}\n"
             f"#define HBUF {1 + hbuf}\n#define LATE_PLANES {late}\n"
             # Every other configuration with short chunks' empty row blocks skipped.
             f"#define ROW_SKIP {0 if n >= first_wg else n % 2}\n#define WGMMA {int(n >= first_wg)}\n"
             f"#define WG_TRI {int(n in tri)}\n#define TRI_SKIP {tri_skip}\n"
             f"#define INTRA_DIAG {int(intra_diag or (pinrec and n in tri))}\n#define INTRA_DOUBLING {intra_doubling}\n"
             f"#define P_IN_REC {int(pinrec and n in tri)}\n"
             f"#define INTRA_DOUBLING_MMA {intra_mma}\n")
        for kernel, fn in [("chunk_intra.cu", "chunk_intra"), ("chunk_recurrent_regs.cu", "chunk_recurrent_regs")]:
            name = f"{fn}_{n}"
            threads = "256" if fn == "chunk_intra" else "THREADS"
            ptype = "IntraParams" if fn == "chunk_intra" else "RecParams"
            entry = (f'\nextern "C" void emu_{name}(const void* p, long long grid, long long smem) {{\n'
                     f'    emu_launch(grid, {threads}, smem, [&] {{ {fn}(*(const {ptype}*)p); }});\n}}\n')
            path = f"{out}_{name}.cpp"
            open(path, "w").write(unit(kernel, d, entry))
            objs.append(path)
        entries.append(f"{{{dk}, {dv}, {vt}, {split}, {ksplit}, {hbuf}, {late}, emu_chunk_intra_{n}, emu_chunk_recurrent_regs_{n}}}")
    decl = "".join(f'extern "C" void emu_chunk_intra_{n}(const void*, long long, long long);\n'
                   f'extern "C" void emu_chunk_recurrent_regs_{n}(const void*, long long, long long);\n'
                   for n in range(len(confs)))
    table = "static const Conf CONFS[] = {" + ", ".join(entries) + "};\n"
    drv_src = f"#define EMU_OUT_BF16 {out_t}\n#define EMU_PIECES {pieces}\n" + open(drv).read().replace("// CONFS", decl + table)
    open(out + "_driver.cpp", "w").write(drv_src)
    cmd = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-w", "-o", out, out + "_driver.cpp"] + objs
    try:
        subprocess.check_call(cmd)
        rc = subprocess.call([out, cases])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
