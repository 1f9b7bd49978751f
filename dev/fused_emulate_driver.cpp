// Driver of the host emulation of the fused prefill kernels (see fused_emulate.py): random
// varlen problems (bf16 q, k, v; l2norm or unit keys; both head maps; an initial state; partial
// and empty sequences) through chunk_intra then chunk_recurrent_regs, against a float64
// recurrence.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>
typedef unsigned long long u64;
typedef long long i64;
// Mirrors of the kernels' parameter structs (chunk_intra.cu, chunk_recurrent_regs.cu).
struct IntraParams {
    u64 q, k, g, beta, a_log, dt_bias;
    u64 a_inv, p, scal;
    u64 chunk_start, chunk_len;
    u64 chunk_decay;
    i64 chunks, h, hv;
    float scale, beta_mult, reset;
    int tiled, l2norm, gate_in_kernel, beta_is_logits;
};
struct RecParams {
    u64 q, k, v, a_inv, p, scal;
    u64 h0;
    u64 o;
    u64 final_state;
    u64 chunk_states;
    u64 chunk_start, chunk_len, seq_first_chunk;
    i64 seqs, h, hv;
    int tiled;
    int part;
    u64 chunk_decay, nan_cols;
    i64 segments, min_seg, warm_max;
    float warm_log;
    u64 seq_order;
    float scale;
    int l2norm;
};
struct Conf {
    int dk, dv, vt, split, ksplit, hbuf, late;
    void (*intra)(const void*, long long, long long);
    void (*rec)(const void*, long long, long long);
};
// CONFS

static unsigned short bf16(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(unsigned short b) {
    unsigned u = (unsigned)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// Relative L2 error over the elements finite in both; infinite where want is NaN and got not,
// or got is NaN where may_nan(i) says the kernels' marking (coarser than the recurrence's: every
// column of a warp from the first bad row on) does not reach.
template <class F>
static double rel_l2(const std::vector<float>& got, const std::vector<double>& want, F may_nan) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i]) && !std::isnan(got[i])) return INFINITY;
        if (std::isnan(got[i]) && !std::isnan(want[i]) && !may_nan(i)) return INFINITY;
        if (std::isnan(want[i]) || std::isnan(got[i])) continue;
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

int main(int argc, char** argv) {
    const int count = argc > 1 ? atoi(argv[1]) : 12;
    std::mt19937_64 rng(7);
    auto U = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
    auto N01 = [&]() { return std::normal_distribution<double>(0, 1)(rng); };
    int failures = 0;
    const int nconf = sizeof(CONFS) / sizeof(CONFS[0]);
    // EMU_CONFS=i,j,..: only the cases of those configurations (the others are skipped).
    const char* only = getenv("EMU_CONFS");
    auto wanted = [&](int n) {
        if (!only) return true;
        for (const char* p = only; *p;) {
            if (atoi(p) == n) return true;
            while (*p && *p != ',') ++p;
            if (*p) ++p;
        }
        return false;
    };
    int run_cases = 0;
    for (int c = 0; c < count; ++c) {
        if (!wanted(c % nconf)) continue;
        ++run_cases;
        const Conf& cf = CONFS[c % nconf];
        const int dk = cf.dk, dv = cf.dv, C = 64;
        const int h = 1 + rng() % 2, hv = h * (1 + rng() % 2);
        const bool l2 = rng() % 2, tiled = rng() % 2, with_h0 = rng() % 2;
        // Every other case in segments (chunk_recurrent_regs' parts 1 and 2): longer sequences,
        // up to 3 segments of at least one chunk, warm-ups of at most 3 chunks to a summed
        // log-decay of -25; some value heads' gates decay too slowly for that (part 2's).
        const bool segd = c % 2 == 1;
        const int max_len = segd ? 400 : 150;
        // Sequences: lengths 0..150 (one empty now and then), at least one token in all.
        std::vector<i64> cu = {0};
        const int seqs = 1 + rng() % 3;
        for (int s = 0; s < seqs; ++s) cu.push_back(cu.back() + (rng() % 5 == 0 ? 0 : 1 + rng() % max_len));
        if (cu.back() == 0) cu.back() = 5;
        const i64 T = cu.back();
        std::vector<i64> cstart, clen, sfirst;
        for (int s = 0; s < seqs; ++s) {
            sfirst.push_back((i64)cstart.size());
            for (i64 t = cu[s]; t < cu[s + 1]; t += C) {
                cstart.push_back(t);
                clen.push_back(std::min<i64>(C, cu[s + 1] - t));
            }
        }
        sfirst.push_back((i64)cstart.size());
        const i64 chunks = (i64)cstart.size();
        std::vector<unsigned short> q(T * h * dk), k(T * h * dk), v(T * hv * dv);
        std::vector<float> qf(q.size()), kf(k.size()), vf(v.size()), g(T * hv), beta(T * hv);
        for (size_t i = 0; i < q.size(); ++i) { q[i] = bf16((float)N01()); qf[i] = from_bf16(q[i]); }
        for (i64 r = 0; r < T * h; ++r) {
            double s = 0;
            std::vector<float> row(dk);
            for (int e = 0; e < dk; ++e) { row[e] = (float)N01(); s += row[e] * row[e]; }
            for (int e = 0; e < dk; ++e) {
                const float x = l2 ? row[e] : (float)(row[e] / std::sqrt(s));
                k[r * dk + e] = bf16(x);
                kf[r * dk + e] = from_bf16(k[r * dk + e]);
            }
        }
        for (size_t i = 0; i < v.size(); ++i) { v[i] = bf16((float)N01()); vf[i] = from_bf16(v[i]); }
        // In some segmented cases one NaN in v, early: its column of the state is NaN from there
        // on, in later segments too (handed on by part 3).
        const bool nan_v = segd && rng() % 2;
        i64 nan_t = T, nan_j = -1;
        if (nan_v) {
            nan_t = (i64)(rng() % (T / 3 + 1));
            nan_j = (i64)(rng() % hv);
            const i64 i = (nan_t * hv + nan_j) * dv + rng() % dv;
            v[i] = 0x7fc0;
            vf[i] = NAN;
        }
        i64 nan_seq = 0;
        while (cu[nan_seq + 1] <= nan_t && nan_seq + 1 < seqs) ++nan_seq;
        // Now and then a gate below the reset threshold (-40): a hard reset mid-chunk.
        std::vector<int> slow(hv);
        for (auto& x : slow) x = segd && rng() % 3 == 0;
        for (i64 i = 0; i < T * hv; ++i)
            g[i] = U(0, 1) < 0.03 ? -50.0f : slow[i % hv] ? -0.001f : (float)(-std::log1p(std::exp(U(-5, 1))) * 0.5);
        for (auto& x : beta) x = (float)U(0, 1);
        const i64 kv = (i64)dk * dv;
        std::vector<float> h0(with_h0 ? seqs * hv * kv : 0);
        for (auto& x : h0) x = (float)(0.1 * N01());
        const float scale = 1.0f / std::sqrt((float)dk);
        // Workspace: a_inv and p planes (3 bf16 pieces of 64 per row), 4 f32 scalings per row.
        // The planes start as NaN: chunk_intra leaves their blocks above the diagonal unwritten,
        // so a recurrent kernel that read one would show it.
        const i64 rows = T * hv;
        std::vector<unsigned short> a_inv(rows * 3 * C, 0xffff), pp(rows * 3 * C, 0xffff);
        std::vector<float> scal(rows * 8), o(T * hv * dv, NAN), fin(seqs * hv * kv, NAN);
        std::vector<float> decay(chunks * hv, NAN);
        std::vector<int> nan_cols(seqs * 3 * hv * 2 * dv, -1);
        IntraParams ip{(u64)q.data(), (u64)k.data(), (u64)g.data(), (u64)beta.data(), 0, 0,
                       (u64)a_inv.data(), (u64)pp.data(), (u64)scal.data(),
                       (u64)cstart.data(), (u64)clen.data(), segd ? (u64)decay.data() : 0,
                       chunks, h, hv, scale, 1.0f, -40.0f,
                       tiled, l2, 0, 0};
        const long long sk = dk + 8;
        const long long intra_smem = (2 * C * (C + 4) + 3 * 256 + 7 * C) * 4 + 16 + 2 * C * sk * 2;
        // Every third case with a third as many blocks as items: the blocks' loops over items
        // (BLOCK_LOOP) then run a second and third item, which one block an item never does.
        auto blocks = [&](long long n) { return c % 3 == 2 ? std::max(1LL, (n + 2) / 3) : n; };
        if (chunks) cf.intra(&ip, blocks(chunks * hv), intra_smem);
        // The sequences longest first, ties in order, as the library orders them.
        std::vector<i64> order(seqs);
        for (i64 n = 0; n < seqs; ++n) order[n] = n;
        std::stable_sort(order.begin(), order.end(), [&](i64 a, i64 b) {
            return sfirst[a + 1] - sfirst[a] > sfirst[b + 1] - sfirst[b];
        });
        // EMU_OUT_BF16: o in bf16 (NaN where unwritten), every fourth case 2 bytes off 16-byte
        // alignment; read back into o as f32.
        std::vector<unsigned short> o16(EMU_OUT_BF16 ? o.size() + 8 : 0, 0x7fc0);
        unsigned short* o16p = o16.data() + (c % 4 == 3 ? 1 : 0);
        RecParams rp{(u64)q.data(), (u64)k.data(), (u64)v.data(), (u64)a_inv.data(), (u64)pp.data(),
                     (u64)scal.data(), with_h0 ? (u64)h0.data() : 0, EMU_OUT_BF16 ? (u64)o16p : (u64)o.data(), (u64)fin.data(), 0,
                     (u64)cstart.data(), (u64)clen.data(), (u64)sfirst.data(), seqs, h, hv, tiled,
                     0, (u64)decay.data(), (u64)nan_cols.data(), 1, 1, 3, -25.0f, (u64)order.data(), scale, l2};
        const int segments = 2 + rng() % 2;
        const long long groups = cf.vt / 16;
        const long long stage = (2 * C * (dk + 8) + 2 * C * (3 * C + 8) + C * (cf.vt + 8)) * 2 + C * 16;
        const long long rec_smem = 2 * stage + (1 + cf.hbuf) * groups * dk * 16 * 4 + (cf.split ? groups * (C * 16 * 4 + 4) : 0) +
                                   (cf.ksplit ? groups * 2 * C * 16 * 4 : 0);
        if (segd) {
            rp.segments = segments;
            rp.part = 1;
            cf.rec(&rp, blocks((long long)seqs * segments * hv * (dv / cf.vt)), rec_smem);
            rp.part = 3;
            cf.rec(&rp, blocks((long long)seqs * segments * hv), 0);
            rp.part = 2;
        }
        cf.rec(&rp, blocks((long long)seqs * hv * (dv / cf.vt)), rec_smem);
        if (EMU_OUT_BF16)
            for (size_t i = 0; i < o.size(); ++i) o[i] = from_bf16(o16p[i]);
        // The float64 recurrence.
        std::vector<double> o_ref(o.size(), 0.0), s_ref(fin.size(), 0.0);
        for (int s = 0; s < seqs; ++s)
            for (int j = 0; j < hv; ++j) {
                const int kh = tiled ? j % h : j / (hv / h);
                std::vector<double> S(kv, 0.0);
                if (with_h0) for (i64 e = 0; e < kv; ++e) S[e] = h0[(s * hv + j) * kv + e];
                for (i64 t = cu[s]; t < cu[s + 1]; ++t) {
                    std::vector<double> kk(dk), qq(dk);
                    double nk = 0, nq = 0;
                    for (int e = 0; e < dk; ++e) {
                        kk[e] = kf[(t * h + kh) * dk + e];
                        qq[e] = qf[(t * h + kh) * dk + e];
                        nk += kk[e] * kk[e];
                        nq += qq[e] * qq[e];
                    }
                    if (l2) for (int e = 0; e < dk; ++e) { kk[e] /= std::sqrt(nk + 1e-6); qq[e] /= std::sqrt(nq + 1e-6); }
                    const double d = std::exp((double)g[t * hv + j]), b = beta[t * hv + j];
                    for (auto& x : S) x *= d;
                    for (int cc = 0; cc < dv; ++cc) {
                        double sk_ = 0;
                        for (int e = 0; e < dk; ++e) sk_ += S[e * dv + cc] * kk[e];
                        const double u = b * (vf[(t * hv + j) * dv + cc] - sk_);
                        for (int e = 0; e < dk; ++e) S[e * dv + cc] += kk[e] * u;
                    }
                    for (int cc = 0; cc < dv; ++cc) {
                        double x = 0;
                        for (int e = 0; e < dk; ++e) x += S[e * dv + cc] * qq[e];
                        o_ref[(t * hv + j) * dv + cc] = scale * x;
                    }
                }
                for (i64 e = 0; e < kv; ++e) s_ref[(s * hv + j) * kv + e] = S[e];
            }
        const double eo = rel_l2(o, o_ref, [&](size_t i) {
            const i64 t = (i64)i / (hv * dv), j = ((i64)i / dv) % hv;
            return j == nan_j && t >= nan_t && t < cu[nan_seq + 1];
        });
        const double es = rel_l2(fin, s_ref, [&](size_t i) {
            return ((i64)i / kv) % hv == nan_j && (i64)i / (hv * kv) == nan_seq;
        });
        // A bf16 o carries its rounding (relative 2^-9 an element at most).
        // One bf16 piece an f32 operand (the fast precision): FLA's bound.
        const double bound = EMU_PIECES < 3 ? 4e-3 : 1e-5;
        const bool ok = eo <= (EMU_OUT_BF16 ? std::max(4e-3, bound) : bound) && es <= bound;
        failures += !ok;
        int nslow = 0;
        for (int x : slow) nslow += x;
        printf("%s case %d: K=%d V=%d VT=%d split=%d ksplit=%d hbuf=%d late=%d H=%d HV=%d seqs=%d T=%lld l2norm=%d tiled=%d h0=%d segments=%d slow heads=%d nan v=%d: o %.2e, final state %.2e\n",
               ok ? "ok  " : "FAIL", c, dk, dv, cf.vt, cf.split, cf.ksplit, cf.hbuf, cf.late, h, hv, seqs, (long long)T, l2, tiled, with_h0,
               segd ? segments : 1, nslow, (int)nan_v, eo, es);
        fflush(stdout);
    }
    printf("%d/%d cases failed\n", failures, run_cases);
    return failures ? 1 : 0;
}
