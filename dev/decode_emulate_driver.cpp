// Driver of the host emulation of kernels/fused/decode.cu (see decode_emulate.py): random steps
// over a pool, every layout, head size, option and index kind, against a float64 reference.
#include <random>
#include <cstdio>
#include <cstdlib>
#include <algorithm>

static unsigned short to_bits(float x, int dt) {
    if (dt == 1) { unsigned u; memcpy(&u, &x, 4); return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
    _Float16 h = (_Float16)x; unsigned short b; memcpy(&b, &h, 2); return b;
}
static float from_bits(unsigned short b, int dt) {
    if (dt == 1) { unsigned u = (unsigned)b << 16; float f; memcpy(&f, &u, 4); return f; }
    _Float16 h; memcpy(&h, &b, 2); return (float)h;
}
// A host array in dtype dt; `vals` are rounded to what is stored.
struct Arr { std::vector<float> f; std::vector<unsigned short> h; int dt; const void* ptr() const { return dt ? (const void*)h.data() : (const void*)f.data(); } };
static Arr make(std::vector<float>& vals, int dt) {
    Arr a; a.dt = dt;
    if (dt == 0) a.f = vals; else { for (auto& v : vals) { a.h.push_back(to_bits(v, dt)); v = from_bits(a.h.back(), dt); } }
    return a;
}

static void launch(bool vfirst, const DecodeParams& P, int warps, int grid) {
    blockDim_g = 32 * warps; gridDim_g = grid;
    for (int b = 0; b < grid; ++b) {
        std::vector<Warp> ws(warps);
        std::vector<std::thread> th;
        for (int tid = 0; tid < 32 * warps; ++tid)
            th.emplace_back([&, tid, b] {
                threadIdx.x = tid; blockIdx.x = b; my_warp = &ws[tid / 32]; my_lane = tid % 32;
                // K = V = 128: every other launch takes the kernel with those sizes as constants.
                if (vfirst) decode_vk(P);
                else if (P.dk == 128 && P.dv == 128 && (b + P.n) % 2 == 0) decode_kv_k128_v128(P);
                else decode_kv(P);
            });
        for (auto& t : th) t.join();
    }
}

int main(int argc, char** argv) {
    const int count = argc > 1 ? atoi(argv[1]) : 150;
    std::mt19937_64 rng(12345);
    auto U = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
    auto N01 = [&]() { return std::normal_distribution<double>(0, 1)(rng); };
    int failures = 0, cases = 0;
    const int dks[] = {16, 32, 64, 128, 256};
    for (int c = 0; c < count; ++c) {
        const bool vfirst = c % 2;
        const int dk = dks[(c / 2) % 5];
        // K = V = 128 in some K-major cases: the kernel with those sizes as constants.
        const int dv = dk == 128 && c % 4 == 0 ? 128 : 4 * (1 + rng() % 40);
        const int n = 1 + rng() % 4, t = 1 + rng() % 4, h = 1 + rng() % 2, hv = h * (1 + rng() % 2);
        const bool l2 = rng() % 2, logits = rng() % 2, neg = logits && rng() % 2, gate = rng() % 2, tiled = rng() % 2;
        const int qkv_dt = rng() % 3, g_dt = rng() % 2, beta_dt = rng() % 3, out_dt = (c % 7 == 3) ? 1 : 0;
        const bool use_read = rng() % 4 != 0, use_write = use_read && rng() % 2, use_tok = use_read && rng() % 2, dense = rng() % 2;
        const bool wide = rng() % 2;
        const int pool = n * (2 + t) + 2;
        const i64 kv = (i64)dk * dv, row = hv * kv;
        std::vector<float> q(n * t * h * dk), k(q.size()), v(n * t * hv * dv), g(n * t * hv), beta(g.size()), alog(hv), dtb(hv), S(pool * row);
        for (auto& x : q) x = N01();
        for (auto& x : k) x = N01();
        if (!l2) for (size_t r = 0; r < q.size() / dk; ++r) for (float* a : {&q[r * dk], &k[r * dk]}) { double s = 0; for (int e = 0; e < dk; ++e) s += a[e] * a[e]; for (int e = 0; e < dk; ++e) a[e] /= sqrt(s); }
        for (auto& x : v) x = N01();
        for (auto& x : g) x = gate ? U(-3, 3) : -U(0, 1.5);
        for (auto& x : beta) x = logits ? U(-4, 4) : U(0, 1);
        for (auto& x : alog) x = U(-2, 1);
        for (auto& x : dtb) x = U(-1, 1);
        for (auto& x : S) x = 0.3 * N01();
        Arr qa = make(q, qkv_dt), ka = make(k, qkv_dt), va = make(v, qkv_dt), ga = make(g, g_dt), ba = make(beta, beta_dt);
        // Indices: distinct rows, some padding / none.
        std::vector<i64> rows(pool); for (int i = 0; i < pool; ++i) rows[i] = i; std::shuffle(rows.begin(), rows.end(), rng);
        size_t next = 0;
        std::vector<i64> rd(n), wr(n), tk(n * t);
        for (int i = 0; i < n; ++i) rd[i] = use_read ? (rng() % 4 == 0 ? -1 : rows[next++]) : i;
        for (int i = 0; i < n; ++i) wr[i] = rng() % 5 == 0 ? -1 : rows[next++];
        for (int i = 0; i < n * t; ++i) tk[i] = rng() % 3 == 0 ? -1 : rows[next++];
        std::vector<int> rd32(rd.begin(), rd.end()), wr32(wr.begin(), wr.end()), tk32(tk.begin(), tk.end());
        auto ip = [&](std::vector<i64>& a, std::vector<int>& b) { return wide ? (const void*)a.data() : (const void*)b.data(); };
        const float scale = gate ? 0.3f : 1.0f / sqrtf((float)dk);
        // Reference in float64.
        std::vector<double> eo(n * t * hv * dv, 0.0), epool(S.begin(), S.end()), ets(dense ? n * t * row : 0, 0.0);
        std::vector<std::pair<i64, std::vector<double>>> writes;
        for (int s = 0; s < n; ++s) {
            if (rd[s] < 0) continue;
            for (int j = 0; j < hv; ++j) {
                const int kh = tiled ? j % h : j / (hv / h);
                std::vector<double> st(kv);  // K-major
                const float* src = &S[(rd[s] * hv + j) * kv];
                for (int r = 0; r < dk; ++r) for (int cc = 0; cc < dv; ++cc) st[r * dv + cc] = vfirst ? src[cc * dk + r] : src[r * dv + cc];
                for (int tt = 0; tt < t; ++tt) {
                    const i64 ti = s * t + tt, tj = ti * hv + j;
                    std::vector<double> qq(dk), kk(dk);
                    double nq = 0, nk = 0;
                    for (int e = 0; e < dk; ++e) { qq[e] = q[(ti * h + kh) * dk + e]; kk[e] = k[(ti * h + kh) * dk + e]; nq += qq[e] * qq[e]; nk += kk[e] * kk[e]; }
                    if (l2) for (int e = 0; e < dk; ++e) { qq[e] /= sqrt(nq + 1e-6); kk[e] /= sqrt(nk + 1e-6); }
                    double ge = g[tj], be = beta[tj];
                    if (gate) { double x = ge + dtb[j]; ge = -exp((double)alog[j]) * (x > 20 ? x : log1p(exp(x))); }
                    if (logits) be = (neg ? 2.0 : 1.0) / (1 + exp(-be));
                    for (auto& x : st) x *= exp(ge);
                    for (int cc = 0; cc < dv; ++cc) {
                        double a = 0; for (int r = 0; r < dk; ++r) a += kk[r] * st[r * dv + cc];
                        double u = be * (v[tj * dv + cc] - a);
                        double o = 0; for (int r = 0; r < dk; ++r) { st[r * dv + cc] += kk[r] * u; o += qq[r] * st[r * dv + cc]; }
                        eo[tj * dv + cc] = scale * o;
                    }
                    std::vector<double> lay(kv);
                    for (int r = 0; r < dk; ++r) for (int cc = 0; cc < dv; ++cc) lay[vfirst ? cc * dk + r : r * dv + cc] = st[r * dv + cc];
                    if (dense) std::copy(lay.begin(), lay.end(), ets.begin() + tj * kv);
                    if (use_tok && tk[ti] >= 0) writes.push_back({(tk[ti] * hv + j) * kv, lay});
                    if (tt + 1 == t) { i64 w = use_write ? wr[s] : rd[s]; if (w >= 0) writes.push_back({(w * hv + j) * kv, lay}); }
                }
            }
        }
        for (auto& w : writes) std::copy(w.second.begin(), w.second.end(), epool.begin() + w.first);
        // The kernel.
        std::vector<float> o_f(eo.size(), 123.f), ts(ets.size(), 321.f);
        std::vector<unsigned short> o_h(eo.size(), 0x7fff);
        DecodeParams P{};
        P.q = qa.ptr(); P.k = ka.ptr(); P.v = va.ptr(); P.g = ga.ptr(); P.beta = ba.ptr(); P.a_log = alog.data(); P.dt_bias = dtb.data();
        P.state = S.data(); P.o = out_dt ? (void*)o_h.data() : (void*)o_f.data();
        P.read_idx = use_read ? ip(rd, rd32) : nullptr; P.write_idx = use_write ? ip(wr, wr32) : nullptr; P.token_idx = use_tok ? ip(tk, tk32) : nullptr;
        P.token_states = dense ? ts.data() : nullptr;
        P.n = n; P.t = t; P.h = h; P.hv = hv; P.dk = dk; P.dv = dv; P.pool = pool; P.scale = scale;
        P.qkv_dtype = qkv_dt; P.g_dtype = g_dt; P.beta_dtype = beta_dt; P.out_dtype = out_dt;
        P.read_i64 = P.write_i64 = P.token_i64 = wide;
        P.tiled = tiled; P.use_qk_l2norm = l2; P.beta_is_logits = logits; P.allow_neg_eigval = neg; P.gate_in_kernel = gate;
        const i64 vt = 2048 / dk, items = (i64)n * hv * ((dv + vt - 1) / vt);
        const int warps = c % 3 == 0 ? 4 : 1;
        const int grid = c % 5 == 0 ? 2 : (int)((items + warps - 1) / warps);
        launch(vfirst, P, warps, grid);
        auto rel = [](const std::vector<double>& e, auto get, size_t len) { double num = 0, den = 0; for (size_t i = 0; i < len; ++i) { double d = get(i) - e[i]; num += d * d; den += e[i] * e[i]; } return den == 0 ? (num == 0 ? 0.0 : INFINITY) : sqrt(num / den); };
        double eo_err = rel(eo, [&](size_t i) { return out_dt ? (double)from_bits(o_h[i], 1) : (double)o_f[i]; }, eo.size());
        double ep_err = rel(epool, [&](size_t i) { return (double)S[i]; }, epool.size());
        double et_err = dense ? rel(ets, [&](size_t i) { return (double)ts[i]; }, ets.size()) : 0;
        const double tol = out_dt ? 1e-2 : 1e-5;
        const bool ok = eo_err < tol && ep_err < 1e-5 && et_err < 1e-5 && !std::isnan(eo_err + ep_err + et_err);
        ++cases;
        if (!ok) ++failures;
        printf("%s case %2d %s dk=%3d dv=%3d n=%d t=%d h=%d hv=%d l2=%d logits=%d neg=%d gate=%d tiled=%d dt=%d/%d/%d out=%d read=%d write=%d tok=%d dense=%d wide=%d warps=%d grid=%d: o %.1e pool %.1e states %.1e\n",
               ok ? "ok  " : "FAIL", c, vfirst ? "vk" : "kv", dk, dv, n, t, h, hv, l2, logits, neg, gate, tiled, qkv_dt, g_dt, beta_dt, out_dt, use_read, use_write, use_tok, dense, wide, warps, grid, eo_err, ep_err, et_err);
    }
    printf("%d/%d cases failed\n", failures, cases);
    return failures != 0;
}
