/* Pareto pruning of many small point sets (one per row), for tensoropt.engine.kprune.
 *
 * Row r holds n points of k coordinates, all minimised; coordinate 0 is time and a point
 * whose time is not finite is padding. A point is dropped when another point of the row
 * (of the same group, when a group coordinate is given) is <= in every coordinate; among
 * equal points the lowest index stays. Kept points come out sorted by (group, coordinates,
 * index), their indices written to out[r, :], the rest -1.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

typedef struct {
    const double *v;   /* this row's points, n x k */
    int k;
    int group;         /* coordinate that splits the row into groups, or -1 */
} sort_ctx;

static int cmp_points(int64_t a, int64_t b, const sort_ctx *c) {
    const double *x = c->v + a * c->k, *y = c->v + b * c->k;
    if (c->group >= 0) {
        if (x[c->group] < y[c->group]) return -1;
        if (x[c->group] > y[c->group]) return 1;
    }
    for (int d = 0; d < c->k; d++) {
        if (d == c->group) continue;
        if (x[d] < y[d]) return -1;
        if (x[d] > y[d]) return 1;
    }
    return (a > b) - (a < b);
}

/* Stable merge sort of indices (portable: qsort_r differs between C libraries). */
static void sort_indices(int64_t *a, int64_t *tmp, int64_t n, const sort_ctx *c) {
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) tmp[o++] = cmp_points(a[j], a[i], c) < 0 ? a[j++] : a[i++];
            while (i < mid) tmp[o++] = a[i++];
            while (j < hi) tmp[o++] = a[j++];
        }
        memcpy(a, tmp, n * sizeof(int64_t));
    }
}

/* Staircase of (u, w) pairs: u strictly ascending, w strictly descending; s, when not
 * NULL, holds a back-pointer per pair. Its arrays have room for every pair inserted. */
typedef struct { double *u, *w; int64_t *s; int64_t n; } stair;

/* The first index with u' > u. */
static inline int64_t stair_after(const stair *s, double u) {
    int64_t lo = 0, hi = s->n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (s->u[mid] <= u) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* The least w among pairs with u' <= u (inf when none). */
static inline double stair_below(const stair *s, double u) {
    int64_t lo = stair_after(s, u);
    return lo > 0 ? s->w[lo - 1] : INFINITY;
}

/* Whether some staircase pair has u' <= u and w' <= w. */
static int stair_covers(const stair *s, double u, double w) {
    int64_t lo = stair_after(s, u);
    return lo > 0 && s->w[lo - 1] <= w;
}

/* Insert (u, w), not covered by any pair, taking out the pairs it is <= in both. */
static void stair_insert(stair *s, double u, double w, int64_t src) {
    int64_t lo = 0, hi = s->n;            /* first index with u' >= u */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (s->u[mid] < u) lo = mid + 1; else hi = mid;
    }
    int64_t end = lo;
    while (end < s->n && s->w[end] >= w) end++;
    int64_t shift = 1 - (end - lo);       /* one in, end - lo out */
    if (shift != 0) {
        memmove(s->u + end + shift, s->u + end, (s->n - end) * sizeof(double));
        memmove(s->w + end + shift, s->w + end, (s->n - end) * sizeof(double));
        if (s->s) memmove(s->s + end + shift, s->s + end, (s->n - end) * sizeof(int64_t));
        s->n += shift;
    }
    s->u[lo] = u;
    s->w[lo] = w;
    if (s->s) s->s[lo] = src;
}

typedef struct {
    int64_t *idx, *kept;
    double *su, *sw;
    int64_t cap;
} workspace;

static int ws_reserve(workspace *w, int64_t n) {
    if (n <= w->cap) return 0;
    int64_t cap = n > 2 * w->cap ? n : 2 * w->cap;
    int64_t *idx = realloc(w->idx, cap * sizeof(int64_t));
    if (idx) w->idx = idx;
    int64_t *kept = realloc(w->kept, cap * sizeof(int64_t));
    if (kept) w->kept = kept;
    double *su = realloc(w->su, cap * sizeof(double));
    if (su) w->su = su;
    double *sw = realloc(w->sw, cap * sizeof(double));
    if (sw) w->sw = sw;
    if (!idx || !kept || !su || !sw) return -1;
    w->cap = cap;
    return 0;
}

static void ws_free(workspace *w) { free(w->idx); free(w->kept); free(w->su); free(w->sw); }

/* Keep the non-dominated points of v (n x k); their indices, in sorted order, go to
 * out[0..count). Returns count. The workspace holds at least n entries. */
static int64_t prune_row(const double *v, int64_t n, int k, int group, workspace *w, int64_t *out) {
    int dims = k - (group >= 0 ? 1 : 0);
    int c1 = -1, c2 = -1;
    for (int d = 1; d < k; d++) {
        if (d == group) continue;
        if (c1 < 0) c1 = d; else if (c2 < 0) c2 = d;
    }
    int64_t *idx = w->idx, *kept = w->kept;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(v[i * k])) idx[m++] = i;
    sort_ctx ctx = {v, k, group};
    sort_indices(idx, kept, m, &ctx);
    int64_t nk = 0, group_start = 0;
    double best = INFINITY;
    stair s = {w->su, w->sw, NULL, 0};
    for (int64_t a = 0; a < m; a++) {
        const double *p = v + idx[a] * k;
        if (group >= 0 && a > 0 && p[group] != v[idx[a - 1] * k + group]) {
            group_start = nk; best = INFINITY; s.n = 0;
        }
        int dominated = 0;
        if (dims <= 1) {
            dominated = nk > group_start;
        } else if (dims == 2) {
            dominated = best <= p[c1];
            if (!dominated) best = p[c1];
        } else if (dims == 3) {
            dominated = stair_covers(&s, p[c1], p[c2]);
            if (!dominated) stair_insert(&s, p[c1], p[c2], 0);
        } else {
            /* A dominating point is also <= in (c1, c2): where no kept point is, skip the scan. */
            int covered = stair_covers(&s, p[c1], p[c2]);
            if (covered) {
                for (int64_t b = nk - 1; b >= group_start && !dominated; b--) {
                    const double *q = v + kept[b] * k;
                    int le = 1;
                    for (int d = 1; d < k && le; d++)
                        if (d != group && q[d] > p[d]) le = 0;
                    dominated = le;
                }
            } else {
                stair_insert(&s, p[c1], p[c2], 0);
            }
        }
        if (!dominated) kept[nk++] = idx[a];
    }
    for (int64_t i = 0; i < nk; i++) out[i] = kept[i];
    return nk;
}

/* Returns 0, or -1 when memory ran out. */
int kd_prune(int64_t rows, int64_t n, int k, const double *vals, int group, int64_t *out)
{
    workspace w = {0};
    if (ws_reserve(&w, n > 0 ? n : 1)) { ws_free(&w); return -1; }
    for (int64_t r = 0; r < rows; r++) {
        int64_t nk = prune_row(vals + r * n * k, n, k, group, &w, out + r * n);
        for (int64_t i = nk; i < n; i++) out[r * n + i] = -1;
    }
    ws_free(&w);
    return 0;
}

enum { OP_SUM = 0, OP_MAX = 1, OP_MIN = 2 };
enum { RULE_COORDS = 0, RULE_FOLD = 1, RULE_UNIT = 2, RULE_UNIT_CLOSE = 3 };

/* Row r of the result: the kept merges of f[r, e, i] with g[r, e, j] over every (e, i, j),
 * f[r, e] starting at f + f_row[r] + f_e[e] (offsets in doubles, so that broadcasting costs
 * nothing), likewise g. Rule RULE_COORDS merges coordinate
 * d by ops[d] (f, g and the result all have k coordinates); RULE_FOLD merges a state
 * (t, R, A[, group]) with a piece (t, M, P1, P2[, group]) into
 * (t + t', R + M, max(A + P1, R + P2)[, min]) and raises A to R + floor. RULE_UNIT merges a
 * state (t, R, A, E, C*[, group]) inside a recomputed unit with a piece
 * (t, M, P1, Q, Z, C, B[, group]) into (t + t', R + M, max(A + P1, R + Q + E'), E' = E + Z,
 * max(C*, E' + C)[, min]); RULE_UNIT_CLOSE, at the unit's last region, into
 * (t + t', R', max(A', R' + B + C*', R' + floor)[, min]) (peaksolve._unit_rule; the same
 * operations in the same order, so the same doubles).
 * out_vals (rows x cap x k) and out_src (rows x cap) get the kept points, their back-pointer
 * (e * wf + i) * wg + j, and out_count the number per row; cap >= ne * wf * wg.
 * Returns 0, or -1 when memory ran out. */
int kd_combine(int64_t rows, int64_t ne, int64_t wf, int64_t wg,
               const double *f, const int64_t *f_row, const int64_t *f_e, int kf,
               const double *g, const int64_t *g_row, const int64_t *g_e, int kg,
               int k, int rule, const int *ops, int group, double floor,
               int64_t cap, double *out_vals, int64_t *out_src, int64_t *out_count)
{
    int64_t n = ne * wf * wg;
    double *cand = malloc((n > 0 ? n : 1) * k * sizeof(double));
    int64_t *keep = malloc((n > 0 ? n : 1) * sizeof(int64_t));
    workspace w = {0};
    if (!cand || !keep || ws_reserve(&w, n > 0 ? n : 1)) { free(cand); free(keep); ws_free(&w); return -1; }
    for (int64_t r = 0; r < rows; r++) {
        int64_t c = 0;
        for (int64_t e = 0; e < ne; e++) {
            const double *fr = f + f_row[r] + f_e[e];
            const double *gr = g + g_row[r] + g_e[e];
            for (int64_t i = 0; i < wf; i++) {
                const double *a = fr + i * kf;
                for (int64_t j = 0; j < wg; j++, c++) {
                    const double *b = gr + j * kg;
                    double *o = cand + c * k;
                    if (rule == RULE_UNIT || rule == RULE_UNIT_CLOSE) {
                        double t = a[0] + b[0], r = a[1] + b[1], e = a[3] + b[4];
                        double x = a[2] + b[2], y = a[1] + b[3] + e;
                        double av = x > y ? x : y;
                        double cy = e + b[5], cs = a[4] > cy ? a[4] : cy;
                        o[0] = t;
                        o[1] = r;
                        if (rule == RULE_UNIT_CLOSE) {
                            double z = r + b[6] + cs, lo = r + floor;
                            av = av > z ? av : z;
                            o[2] = av > lo ? av : lo;
                            if (k > 3) o[3] = a[5] < b[7] ? a[5] : b[7];
                        } else {
                            o[2] = av; o[3] = e; o[4] = cs;
                            if (k > 5) o[5] = a[5] < b[7] ? a[5] : b[7];
                        }
                    } else if (rule == RULE_FOLD) {
                        o[0] = a[0] + b[0];
                        o[1] = a[1] + b[1];
                        double x = a[2] + b[2], y = a[1] + b[3];
                        double av = x > y ? x : y, lo = o[1] + floor;
                        o[2] = av > lo ? av : lo;
                        if (k > 3) o[3] = a[3] < b[4] ? a[3] : b[4];
                    } else {
                        for (int d = 0; d < k; d++) {
                            double x = a[d], y = b[d];
                            o[d] = ops[d] == OP_SUM ? x + y : ops[d] == OP_MAX ? (x > y ? x : y) : (x < y ? x : y);
                        }
                    }
                }
            }
        }
        int64_t nk = prune_row(cand, n, k, group, &w, keep);
        double *ov = out_vals + r * cap * k;
        int64_t *os = out_src + r * cap;
        for (int64_t q = 0; q < nk; q++) {
            memcpy(ov + q * k, cand + keep[q] * k, k * sizeof(double));
            os[q] = keep[q];
        }
        out_count[r] = nk;
    }
    free(cand); free(keep); ws_free(&w);
    return 0;
}

/* ------------------------------------------------------------------------------------- */
/* The fold of peaksolve (RULE_FOLD) with most candidates never built. Per output row:
 *  1. a sample of candidates (every SAMPLE-th state point with every piece point) is pruned
 *     into real points S;
 *  2. S is put on a grid over (time, R) buckets: best[bt][br] is the least A of the points
 *     at least one whole bucket below in both (so they are strictly smaller there, whatever
 *     the rounding);
 *  3. for every run of SEG consecutive state points and every piece point, the run's ideal
 *     (each coordinate's least over the run) is tested against the grid and skipped when a
 *     point of S beats it; the others' candidates are tested one by one and kept;
 *  4. the kept ones and S are pruned exactly.
 * A candidate that some point of S beats is never on the frontier, so this is exact. */

#define SEG 4
#define SAMPLE 8
#define GRID 512

typedef struct {
    double t_lo, t_scale, r_lo, r_scale;
    double best[2][GRID + 1][GRID + 1];   /* per group (0/1) */
    int empty;
} grid;

static int bucket_of(double x, double lo, double scale) {
    double b = floor((x - lo) * scale);
    if (!(b >= 0)) return -1;
    if (b >= GRID) return GRID - 1;
    return (int)b;
}

static void grid_build(grid *gr, const double *pts, int64_t n, int k, int group) {
    double tl = INFINITY, th = -INFINITY, rl = INFINITY, rh = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const double *p = pts + i * k;
        if (p[0] < tl) tl = p[0];
        if (p[0] > th) th = p[0];
        if (p[1] < rl) rl = p[1];
        if (p[1] > rh) rh = p[1];
    }
    gr->empty = n == 0;
    gr->t_lo = tl; gr->r_lo = rl;
    gr->t_scale = th > tl ? (GRID - 2) / (th - tl) : 1.0;
    gr->r_scale = rh > rl ? (GRID - 2) / (rh - rl) : 1.0;
    for (int g = 0; g < 2; g++)
        for (int a = 0; a <= GRID; a++)
            for (int b = 0; b <= GRID; b++) gr->best[g][a][b] = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const double *p = pts + i * k;
        int g = group >= 0 ? (p[group] != 0.0) : 0;
        double ft = ceil((p[0] - tl) * gr->t_scale) + 1, fr = ceil((p[1] - rl) * gr->r_scale) + 1;
        int bt = ft > GRID ? GRID : (int)ft, br = fr > GRID ? GRID : (int)fr;
        if (p[2] < gr->best[g][bt][br]) gr->best[g][bt][br] = p[2];
    }
    for (int g = 0; g < 2; g++)
        for (int a = 0; a <= GRID; a++)
            for (int b = 0; b <= GRID; b++) {
                double v = gr->best[g][a][b];
                if (a > 0 && gr->best[g][a - 1][b] < v) v = gr->best[g][a - 1][b];
                if (b > 0 && gr->best[g][a][b - 1] < v) v = gr->best[g][a][b - 1];
                gr->best[g][a][b] = v;
            }
    for (int g = 0; g < 2; g++)
        for (int a = 0; a <= GRID; a++) gr->best[g][a][GRID] = INFINITY;  /* beyond the range: never */
}

/* whether some point of the grid's set, of group g, beats (t, r, a) */
static int grid_beats(const grid *gr, int g, double t, double r, double a) {
    if (gr->empty) return 0;
    int bt = bucket_of(t, gr->t_lo, gr->t_scale), br = bucket_of(r, gr->r_lo, gr->r_scale);
    if (bt < 0 || br < 0) return 0;
    return gr->best[g][bt][br] <= a;
}

typedef struct { double *v; int64_t *src; int64_t n, cap; int k; } buffer;

/* Rows with fewer candidates go without the grid (a variable, so that tests can send every
 * row through it). */
int64_t kd_fold_grid_min = 32768;

int64_t kd_fold_stats[6];   /* sampled, kept of them, runs tested, runs skipped, candidates kept, final */

static int buf_push(buffer *b, const double *p, int64_t src) {
    if (b->n == b->cap) {
        int64_t cap = b->cap ? 2 * b->cap : 1024;
        double *v = realloc(b->v, cap * b->k * sizeof(double));
        if (!v) return -1;
        b->v = v;
        int64_t *s = realloc(b->src, cap * sizeof(int64_t));
        if (!s) return -1;
        b->src = s;
        b->cap = cap;
    }
    memcpy(b->v + b->n * b->k, p, b->k * sizeof(double));
    b->src[b->n++] = src;
    return 0;
}

static inline void fold_point(const double *a, const double *b, int k, double floor, double *o) {
    o[0] = a[0] + b[0];
    o[1] = a[1] + b[1];
    double x = a[2] + b[2], y = a[1] + b[3];
    double av = x > y ? x : y, lo = o[1] + floor;
    o[2] = av > lo ? av : lo;
    if (k > 3) o[3] = a[3] < b[4] ? a[3] : b[4];
}

/* Same arguments and results as kd_combine with RULE_FOLD (k is 3, or 4 with a group at 3). */
int kd_fold(int64_t rows, int64_t ne, int64_t wf, int64_t wg,
            const double *f, const int64_t *f_row, const int64_t *f_e,
            const double *g, const int64_t *g_row, const int64_t *g_e,
            int k, int group, double floor,
            int64_t cap, double *out_vals, int64_t *out_src, int64_t *out_count)
{
    const int kf = k, kg = k + 1;
    buffer sample = {0}, kept = {0};
    sample.k = kept.k = k;
    workspace w = {0};
    int64_t *keep = NULL;
    grid *gr = malloc(sizeof(grid));
    int status = gr ? 0 : -1;
    double o[4];
    for (int64_t r = 0; r < rows && status == 0; r++) {
        sample.n = kept.n = 0;
        /* 1. sampled candidates, pruned */
        for (int64_t e = 0; e < ne && status == 0; e++) {
            const double *fr = f + f_row[r] + f_e[e], *gg = g + g_row[r] + g_e[e];
            for (int64_t i = 0; i < wf && status == 0; i += SAMPLE) {
                if (!isfinite(fr[i * kf])) break;
                for (int64_t j = 0; j < wg && status == 0; j++) {
                    if (!isfinite(gg[j * kg])) break;
                    fold_point(fr + i * kf, gg + j * kg, k, floor, o);
                    status = buf_push(&sample, o, (e * wf + i) * wg + j);
                }
            }
        }
        if (status) break;
        if (ws_reserve(&w, sample.n + 1)) { status = -1; break; }
        int64_t *tmp = realloc(keep, (sample.n + 1) * sizeof(int64_t));
        if (!tmp) { status = -1; break; }
        keep = tmp;
        int64_t ns = prune_row(sample.v, sample.n, k, group, &w, keep);
        kd_fold_stats[0] += sample.n; kd_fold_stats[1] += ns;
        for (int64_t q = 0; q < ns && status == 0; q++)
            status = buf_push(&kept, sample.v + keep[q] * k, sample.src[keep[q]]);
        if (status) break;
        /* Building the grid costs about a millisecond whatever the row; where the row has
         * few candidates it goes unbuilt (empty: it beats nothing), which keeps the same
         * points: the grid only ever drops candidates a point of S beats. */
        if (ne * wf * wg >= kd_fold_grid_min) grid_build(gr, kept.v, kept.n, k, group);
        else gr->empty = 1;
        int64_t n_sampled = kept.n;
        /* 3. runs of state points against every piece point */
        for (int64_t e = 0; e < ne && status == 0; e++) {
            const double *fr = f + f_row[r] + f_e[e], *gg = g + g_row[r] + g_e[e];
            int64_t nf = 0, ng = 0;
            while (nf < wf && isfinite(fr[nf * kf])) nf++;
            while (ng < wg && isfinite(gg[ng * kg])) ng++;
            for (int64_t s0 = 0; s0 < nf && status == 0; s0 += SEG) {
                int64_t s1 = s0 + SEG < nf ? s0 + SEG : nf;
                double tm = INFINITY, rm = INFINITY, am = INFINITY;
                int has0 = 0, has1 = 0;
                for (int64_t i = s0; i < s1; i++) {
                    const double *p = fr + i * kf;
                    if (p[0] < tm) tm = p[0];
                    if (p[1] < rm) rm = p[1];
                    if (p[2] < am) am = p[2];
                    if (group >= 0) { if (p[3] != 0.0) has1 = 1; else has0 = 1; } else has0 = 1;
                }
                for (int64_t j = 0; j < ng && status == 0; j++) {
                    const double *b = gg + j * kg;
                    double it = tm + b[0], ir = rm + b[1];
                    double ia = am + b[2], y = rm + b[3], lo = ir + floor;
                    if (y > ia) ia = y;
                    if (lo > ia) ia = lo;
                    int bg = group >= 0 ? (b[4] != 0.0) : 0;
                    /* the candidates' groups: 1 only where both are 1 */
                    int g0 = has0 || !bg, g1 = has1 && bg;
                    kd_fold_stats[2]++;
                    if ((!g0 || grid_beats(gr, 0, it, ir, ia)) && (!g1 || grid_beats(gr, 1, it, ir, ia))) {
                        kd_fold_stats[3]++;
                        continue;
                    }
                    for (int64_t i = s0; i < s1 && status == 0; i++) {
                        fold_point(fr + i * kf, b, k, floor, o);
                        int cg = group >= 0 ? (o[3] != 0.0) : 0;
                        if (grid_beats(gr, cg, o[0], o[1], o[2])) continue;
                        status = buf_push(&kept, o, (e * wf + i) * wg + j);
                    }
                }
            }
        }
        if (status) break;
        /* 4. exact */
        if (ws_reserve(&w, kept.n + 1)) { status = -1; break; }
        tmp = realloc(keep, (kept.n + 1) * sizeof(int64_t));
        if (!tmp) { status = -1; break; }
        keep = tmp;
        (void)n_sampled;
        int64_t nk = prune_row(kept.v, kept.n, k, group, &w, keep);
        kd_fold_stats[4] += kept.n; kd_fold_stats[5] += nk;
        if (nk > cap) { status = -2; break; }
        double *ov = out_vals + r * cap * k;
        int64_t *os = out_src + r * cap;
        for (int64_t q = 0; q < nk; q++) {
            memcpy(ov + q * k, kept.v + keep[q] * k, k * sizeof(double));
            os[q] = kept.src[keep[q]];
        }
        out_count[r] = nk;
    }
    free(sample.v); free(sample.src); free(kept.v); free(kept.src); free(keep); free(gr); ws_free(&w);
    return status;
}

/* ------------------------------------------------------------------------------------- */
/* The engine's union of sums in (time, memory), for tensoropt.engine.factors.sum_prune.
 * Row r of the result is the Pareto set of f[r, e, i] + g[r, e, j] over every (e, i, j)
 * (f and g: rows x ne x w, each (e) list sorted by time with memory falling, inf-padded),
 * each kept point's back-pointer (e * wf + i) * wg + j; among equal points the lowest
 * back-pointer stays, as in pareto.prune_rows.
 *
 * Candidates are visited in back-pointer order and kept in a staircase (time, memory) of
 * the points kept so far (time strictly rising, memory strictly falling). One that a staircase point
 * is <= in both is dropped (that point came earlier), else it goes in and takes out the
 * points it is <= in both. Along one f point's list, time rises and memory falls, so a
 * dropped candidate at time t lets the walk jump, by bisection, to the first later one
 * whose memory is below the staircase's memory at t: everything before it is dominated
 * by the same staircase point. The jump needs a well-formed g list (finite prefix,
 * sorted, inf after); other lists are walked one candidate at a time. A whole e goes
 * when the staircase already dominates its ideal point (least time, least memory).
 * out_t, out_m, out_src (rows x cap) get each row's points in time order, out_count
 * their number. Returns 0, -1 when memory ran out, or 1 when a row held more than cap
 * points (out_count then says how many). */

/* The staircase on a workspace's arrays (su, sw, and kept for back-pointers), with room
 * for one more pair. */
static int stair_room(stair *s, workspace *w) {
    if (ws_reserve(w, s->n + 1)) return -1;
    s->u = w->su; s->w = w->sw; s->s = w->kept;
    return 0;
}

/* Length of the finite prefix of a g list when the list is well formed, else -1. */
static int64_t sorted_prefix(const double *t, const double *m, int64_t w) {
    int64_t n = 0;
    while (n < w && isfinite(t[n])) {
        if (n > 0 && (t[n] < t[n - 1] || !(m[n] <= m[n - 1]))) return -1;
        n++;
    }
    for (int64_t j = n; j < w; j++)
        if (isfinite(t[j])) return -1;
    return n;
}

/* Candidates of one row in time order: one run per (e, entry of the shorter list), along
 * the longer list, which must be a staircase (time ascending, memory not rising) for each e.
 * A run's head is the next candidate it can give; runs sit in a binary heap keyed by (time,
 * memory, back-pointer), the order in which a candidate is kept exactly when its memory is
 * below every candidate's before it. A head that is not kept moves on, by bisection, to the
 * first point of its run below that memory, or the run ends. Every kept candidate goes to
 * the staircase's end: no candidate is inserted and later removed.
 *
 * Sums of distinct times can round to one time; a run's points of one rounded time are
 * taken as one head, the least memory among them (the first such, the lowest back-pointer),
 * so that heads come out of each run in strictly rising time: the order the heap needs. */
#define MERGE_MIN_WIDTH 32     /* rows whose longer list is shorter take the insertion loop */
/* 32 bytes: two to a cache line (a run's length and the number of runs fit 32 bits, see
 * merges) */
typedef struct { double t, m; int64_t src; int32_t run, next; } head;

static inline int head_before(const head *a, const head *b) {
    if (a->t != b->t) return a->t < b->t;
    if (a->m != b->m) return a->m < b->m;
    return a->src < b->src;
}

/* A 4-ary heap: half the levels of a binary one, and a node's children share cache lines. */
#define HEAP_ARITY 4
static void sift_down(head *h, int64_t n, int64_t i) {
    head x = h[i];
    for (;;) {
        int64_t c = HEAP_ARITY * i + 1;
        if (c >= n) break;
        int64_t end = c + HEAP_ARITY < n ? c + HEAP_ARITY : n, b = c;
        for (int64_t k = c + 1; k < end; k++) if (head_before(&h[k], &h[b])) b = k;
        if (!head_before(&h[b], &x)) break;
        h[i] = h[b];
        i = b;
    }
    h[i] = x;
}

typedef struct {
    const double *lt, *lm;     /* the longer list of this run's e */
    double st, sm;             /* the shorter list's entry */
    int64_t len, code, step;   /* finite prefix; back-pointer at pos 0, and per pos */
    int f_long;
} run;

/* The sums in the order the other loop adds them: f's point, then g's. */
static inline double run_t(const run *q, int64_t p) { return q->f_long ? q->lt[p] + q->st : q->st + q->lt[p]; }
static inline double run_m(const run *q, int64_t p) { return q->f_long ? q->lm[p] + q->sm : q->sm + q->lm[p]; }

/* x: the head of run q from position p on (p < len): the points of p's rounded time, the
 * least memory among them, and where the run goes on after them. */
static void settle(head *x, const run *q, int64_t p) {
    double t = run_t(q, p), m = run_m(q, p);
    int64_t best = p, k = p + 1;
    for (; k < q->len && run_t(q, k) == t; k++) {
        double mk = run_m(q, k);
        if (mk < m) { m = mk; best = k; }
    }
    x->t = t; x->m = m; x->next = (int32_t)k;
    x->src = q->code + best * q->step;
}

static int merge_row(int64_t ne, int64_t wf, int64_t wg, const double *at, const double *am,
                     const double *bt, const double *bm, int f_long, stair *s, workspace *w)
{
    int64_t wl = f_long ? wf : wg, ws = f_long ? wg : wf;
    run *runs = malloc((ne * ws > 0 ? ne * ws : 1) * sizeof(run));
    head *h = malloc((ne * ws > 0 ? ne * ws : 1) * sizeof(head));
    if (!runs || !h) { free(runs); free(h); return -1; }
    int64_t n = 0;
    for (int64_t e = 0; e < ne; e++) {
        const double *lt = (f_long ? at : bt) + e * wl, *lm = (f_long ? am : bm) + e * wl;
        const double *st = (f_long ? bt : at) + e * ws, *sm = (f_long ? bm : am) + e * ws;
        int64_t len = sorted_prefix(lt, lm, wl);
        if (len <= 0) continue;
        for (int64_t k = 0; k < ws; k++) {
            if (!isfinite(st[k])) continue;
            run *q = runs + n;
            q->lt = lt; q->lm = lm; q->st = st[k]; q->sm = sm[k]; q->len = len; q->f_long = f_long;
            /* src = (e * wf + i) * wg + j, with i or j the position along the run */
            q->code = f_long ? e * wf * wg + k : (e * wf + k) * wg;
            q->step = f_long ? wg : 1;
            h[n].run = (int32_t)n;
            settle(h + n, q, 0);
            n++;
        }
    }
    if (n > 1) for (int64_t i = (n - 2) / HEAP_ARITY; i >= 0; i--) sift_down(h, n, i);
    double below = INFINITY;
    while (n > 0) {
        head *x = h;
        run *q = runs + x->run;
        int64_t pos = x->next;
        if (x->m < below) {
            if (stair_room(s, w)) { free(runs); free(h); return -1; }
            s->u[s->n] = x->t; s->w[s->n] = x->m; s->s[s->n] = x->src; s->n++;
            below = x->m;
        } else {   /* the first later point of the run below `below`, or none: it is
                    * mostly a few points on, so gallop to it before bisecting */
            int64_t hi = pos, step = 1;
            while (hi < q->len && !(run_m(q, hi) < below)) {
                pos = hi + 1;
                hi += step;
                step *= 2;
            }
            if (hi > q->len) hi = q->len;
            while (pos < hi) {
                int64_t mid = (pos + hi) / 2;
                if (run_m(q, mid) < below) hi = mid; else pos = mid + 1;
            }
        }
        if (pos >= q->len) h[0] = h[--n];
        else settle(x, q, pos);
        if (n > 0) sift_down(h, n, 0);
    }
    free(runs); free(h);
    return 0;
}

/* Whether row r's longer lists are all staircases and long enough for merge_row to pay. */
static int merges(int64_t ne, int64_t wf, int64_t wg, const double *at, const double *am,
                  const double *bt, const double *bm)
{
    int f_long = wf >= wg;
    int64_t wl = f_long ? wf : wg;
    if (wl < MERGE_MIN_WIDTH || wl > INT32_MAX || ne * (f_long ? wg : wf) > INT32_MAX) return 0;
    for (int64_t e = 0; e < ne; e++)
        if (sorted_prefix((f_long ? at : bt) + e * wl, (f_long ? am : bm) + e * wl, wl) < 0) return 0;
    return 1;
}

int pareto_sum2(int64_t rows, int64_t ne, int64_t wf, int64_t wg,
                const double *ft, const double *fm, const double *gt, const double *gm,
                int64_t cap, double *out_t, double *out_m, int64_t *out_src, int64_t *out_count)
{
    workspace w = {0};
    stair s = {0};
    int status = 0;
    if (ws_reserve(&w, 64)) return -1;
    stair_room(&s, &w);
    for (int64_t r = 0; r < rows; r++) {
        s.n = 0;
        const double *rft = ft + r * ne * wf, *rfm = fm + r * ne * wf;
        const double *rgt = gt + r * ne * wg, *rgm = gm + r * ne * wg;
        if (merges(ne, wf, wg, rft, rfm, rgt, rgm)) {
            if (merge_row(ne, wf, wg, rft, rfm, rgt, rgm, wf >= wg, &s, &w)) { ws_free(&w); return -1; }
            goto row_done;
        }
        for (int64_t e = 0; e < ne; e++) {
            const double *at = ft + (r * ne + e) * wf, *am = fm + (r * ne + e) * wf;
            const double *bt = gt + (r * ne + e) * wg, *bm = gm + (r * ne + e) * wg;
            int64_t len = sorted_prefix(bt, bm, wg);
            /* every candidate of this e is no faster and no leaner than its ideal point */
            double lo_t = INFINITY, lo_m = INFINITY, lo_bt = INFINITY, lo_bm = INFINITY;
            for (int64_t i = 0; i < wf; i++)
                if (isfinite(at[i])) { lo_t = fmin(lo_t, at[i]); lo_m = fmin(lo_m, am[i]); }
            for (int64_t j = 0; j < wg; j++)
                if (isfinite(bt[j])) { lo_bt = fmin(lo_bt, bt[j]); lo_bm = fmin(lo_bm, bm[j]); }
            if (!isfinite(lo_t) || !isfinite(lo_bt) || !(lo_m + lo_bm < stair_below(&s, lo_t + lo_bt))) continue;
            for (int64_t i = 0; i < wf; i++) {
                double a_t = at[i], a_m = am[i];
                if (!isfinite(a_t)) continue;
                int64_t base = (e * wf + i) * wg;
                int64_t j = 0, end = len >= 0 ? len : wg;
                while (j < end) {
                    double b_t = bt[j];
                    if (!isfinite(b_t)) { j++; continue; }
                    double t = a_t + b_t, m = a_m + bm[j];
                    double below = stair_below(&s, t);
                    if (!(m < below)) {
                        if (len < 0) { j++; continue; }
                        int64_t lo = j + 1, hi = end;   /* first later j with memory < below */
                        while (lo < hi) {
                            int64_t mid = (lo + hi) / 2;
                            if (a_m + bm[mid] < below) hi = mid; else lo = mid + 1;
                        }
                        j = lo;
                        continue;
                    }
                    if (stair_room(&s, &w)) { ws_free(&w); return -1; }
                    stair_insert(&s, t, m, base + j);
                    j++;
                }
            }
        }
    row_done:
        out_count[r] = s.n;
        if (s.n > cap) { status = 1; continue; }
        memcpy(out_t + r * cap, s.u, s.n * sizeof(double));
        memcpy(out_m + r * cap, s.w, s.n * sizeof(double));
        memcpy(out_src + r * cap, s.s, s.n * sizeof(int64_t));
    }
    ws_free(&w);
    return status;
}

/* ------------------------------------------------------------------------------------- */
/* One min-sum elimination step of the lower bounds (tensoropt.engine.bounds._sum_min):
 * out[rest, w] = min over k of the sum over factors of table_f[rest, k, w], where each
 * table is a view broadcast over the step's scope (its strides in elements, 0 along the
 * dims it does not hold) and the weights run last. The sums add the factors in their
 * order from 0.0 and the minimum keeps the first least, as the numpy code does, so the
 * two give the same numbers. shape: the scope's nd sizes; strides: nf x (nd + 1); out:
 * the scope without axis, then nw, contiguous. Returns 0, or -1 when memory ran out.
 *
 * A factor's level is the last dim of the rest (the scope without axis, last fastest)
 * along which it varies, -1 for none. Where the factors come in order of level, the sum
 * of those up to each level is kept and redone only when a dim at or above that level
 * moves on: a cell then costs the adds of the factors of the last level alone, not of all
 * of them. The sums are the same, in the same order. */
static int varies(const int64_t *shape, const int64_t *st, int d) { return shape[d] > 1 && st[d] != 0; }

int min_sum_step(int nd, const int64_t *shape, int axis, int64_t nw, int nf,
                 const double *const *tables, const int64_t *strides, double *out)
{
    int64_t kn = shape[axis];
    int nr = nd > 0 ? nd - 1 : 0;                 /* rest dims, outermost first */
    int64_t row = kn * nw > 0 ? kn * nw : 1;
    int *rest = calloc(nd > 0 ? nd : 1, sizeof(int));
    int *level = calloc(nf > 0 ? nf : 1, sizeof(int));
    int64_t *idx = calloc(nd > 0 ? nd : 1, sizeof(int64_t));
    int64_t *base = calloc(nf > 0 ? nf : 1, sizeof(int64_t));
    double *acc = malloc((nr + 1) * row * sizeof(double));
    int *lastf = calloc(nf > 0 ? nf : 1, sizeof(int));
    if (!rest || !level || !idx || !base || !acc || !lastf) {
        free(rest); free(level); free(idx); free(base); free(acc); free(lastf); return -1;
    }
    for (int d = 0, p = 0; d < nd; d++) if (d != axis) rest[p++] = d;
    int dense = 1;                          /* every table's weights contiguous */
    int ordered = 1;                        /* factors in order of level */
    for (int f = 0; f < nf; f++) {
        const int64_t *st = strides + (int64_t)f * (nd + 1);
        if (st[nd] != 1) dense = 0;
        level[f] = -1;
        for (int p = 0; p < nr; p++) if (varies(shape, st, rest[p])) level[f] = p;
        if (f > 0 && level[f] < level[f - 1]) ordered = 0;
    }
    if (!ordered) for (int f = 0; f < nf; f++) level[f] = nr - 1;   /* one level: every add per cell */
    /* sums[p + 1]: the factors of levels <= p; sums[0] holds those of level -1 */
    double *sums = acc;
    int64_t cells = 1;
    for (int p = 0; p < nr; p++) cells *= shape[rest[p]];
    int from = -1;                          /* the outermost level to redo */
    int last = nr - 1;                      /* the level summed on the fly, cell by cell */
    int nlast = 0;
    for (int f = 0; f < nf; f++) if (level[f] == last) lastf[nlast++] = f;
    for (int64_t c = 0; c < cells; c++) {
        for (int p = from; p < (last < 0 ? 0 : last); p++) {   /* with no rest, level -1 is the total */
            double *a = sums + (int64_t)(p + 1) * row;
            if (p < 0) for (int64_t q = 0; q < kn * nw; q++) a[q] = 0.0;
            else memcpy(a, a - row, kn * nw * sizeof(double));
            for (int f = 0; f < nf; f++) {
                if (level[f] != p) continue;
                const int64_t *st = strides + (int64_t)f * (nd + 1);
                const double *t = tables[f] + base[f];
                int64_t sk = st[axis], sw = st[nd];
                for (int64_t k = 0; k < kn; k++) {
                    double *ak = a + k * nw;
                    const double *tk = t + k * sk;
                    if (dense) for (int64_t w = 0; w < nw; w++) ak[w] += tk[w];
                    else for (int64_t w = 0; w < nw; w++) ak[w] += tk[w * sw];
                }
            }
        }
        const double *prev = sums + (int64_t)(last < 0 ? 0 : last) * row;
        double *o = out + c * nw;
        if (last < 0) {                     /* no rest: the level -1 sums are the total */
            for (int64_t w = 0; w < nw; w++) o[w] = prev[w];
            for (int64_t k = 1; k < kn; k++)
                for (int64_t w = 0; w < nw; w++) o[w] = prev[k * nw + w] < o[w] ? prev[k * nw + w] : o[w];
        } else {
            double *v = sums + (int64_t)nr * row;    /* one k's sums, then the next's */
            if (nlast == 1 && dense) {
                const int64_t sk = strides[(int64_t)lastf[0] * (nd + 1) + axis];
                const double *t = tables[lastf[0]] + base[lastf[0]];
                for (int64_t w = 0; w < nw; w++) o[w] = prev[w] + t[w];
                for (int64_t k = 1; k < kn; k++) {
                    const double *pk = prev + k * nw, *tk = t + k * sk;
                    for (int64_t w = 0; w < nw; w++) {
                        double x = pk[w] + tk[w];
                        o[w] = x < o[w] ? x : o[w];
                    }
                }
            } else for (int64_t k = 0; k < kn; k++) {
                memcpy(v, prev + k * nw, nw * sizeof(double));
                for (int q = 0; q < nlast; q++) {
                    const int64_t *st = strides + (int64_t)lastf[q] * (nd + 1);
                    const double *tk = tables[lastf[q]] + base[lastf[q]] + k * st[axis];
                    if (dense) for (int64_t w = 0; w < nw; w++) v[w] += tk[w];
                    else for (int64_t w = 0; w < nw; w++) v[w] += tk[w * st[nd]];
                }
                if (k == 0) memcpy(o, v, nw * sizeof(double));
                else for (int64_t w = 0; w < nw; w++) o[w] = v[w] < o[w] ? v[w] : o[w];
            }
        }
        /* the next cell of the rest, last dim fastest */
        from = last;
        for (int p = nr - 1; p >= 0; p--) {
            int d = rest[p];
            from = p;
            idx[d]++;
            for (int f = 0; f < nf; f++) base[f] += strides[(int64_t)f * (nd + 1) + d];
            if (idx[d] < shape[d]) break;
            for (int f = 0; f < nf; f++) base[f] -= strides[(int64_t)f * (nd + 1) + d] * shape[d];
            idx[d] = 0;
        }
    }
    free(rest); free(level); free(idx); free(base); free(acc); free(lastf);
    return 0;
}
