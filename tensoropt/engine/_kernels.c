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

/* Staircase of (u, w) pairs: u strictly ascending, w strictly descending. */
typedef struct { double *u, *w; int64_t n; } stair;

/* Whether some staircase pair has u' <= u and w' <= w. */
static int stair_covers(const stair *s, double u, double w) {
    int64_t lo = 0, hi = s->n;            /* first index with u' > u */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (s->u[mid] <= u) lo = mid + 1; else hi = mid;
    }
    return lo > 0 && s->w[lo - 1] <= w;
}

static void stair_insert(stair *s, double u, double w) {
    int64_t lo = 0, hi = s->n;            /* first index with u' >= u */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (s->u[mid] < u) lo = mid + 1; else hi = mid;
    }
    int64_t end = lo;                     /* pairs the new one covers: u' >= u and w' >= w */
    while (end < s->n && s->w[end] >= w) end++;
    int64_t removed = end - lo;
    if (removed == 0) {
        memmove(s->u + lo + 1, s->u + lo, (s->n - lo) * sizeof(double));
        memmove(s->w + lo + 1, s->w + lo, (s->n - lo) * sizeof(double));
        s->n++;
    } else if (removed > 1) {
        memmove(s->u + lo + 1, s->u + end, (s->n - end) * sizeof(double));
        memmove(s->w + lo + 1, s->w + end, (s->n - end) * sizeof(double));
        s->n -= removed - 1;
    }
    s->u[lo] = u;
    s->w[lo] = w;
}

/* Returns 0, or -1 when memory ran out. */
int kd_prune(int64_t rows, int64_t n, int k, const double *vals, int group, int64_t *out)
{
    int64_t *idx = malloc((n > 0 ? n : 1) * sizeof(int64_t));
    int64_t *kept = malloc((n > 0 ? n : 1) * sizeof(int64_t));
    double *su = malloc((n > 0 ? n : 1) * sizeof(double));
    double *sw = malloc((n > 0 ? n : 1) * sizeof(double));
    if (!idx || !kept || !su || !sw) { free(idx); free(kept); free(su); free(sw); return -1; }
    int dims = k - (group >= 0 ? 1 : 0);          /* coordinates that order points */
    int c1 = -1, c2 = -1;                          /* the two besides time, when dims == 3 */
    for (int d = 1; d < k; d++) {
        if (d == group) continue;
        if (c1 < 0) c1 = d; else if (c2 < 0) c2 = d;
    }
    for (int64_t r = 0; r < rows; r++) {
        const double *v = vals + r * n * k;
        int64_t *o = out + r * n;
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (isfinite(v[i * k])) idx[m++] = i;
        sort_ctx ctx = {v, k, group};
        sort_indices(idx, kept, m, &ctx);
        int64_t nk = 0, group_start = 0;
        double best = INFINITY;                    /* dims == 2: least second coordinate so far */
        stair s = {su, sw, 0};
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
                if (!dominated) stair_insert(&s, p[c1], p[c2]);
            } else {
                for (int64_t b = nk - 1; b >= group_start && !dominated; b--) {
                    const double *q = v + kept[b] * k;
                    int le = 1;
                    for (int d = 1; d < k && le; d++)
                        if (d != group && q[d] > p[d]) le = 0;
                    dominated = le;
                }
            }
            if (!dominated) kept[nk++] = idx[a];
        }
        for (int64_t i = 0; i < nk; i++) o[i] = kept[i];
        for (int64_t i = nk; i < n; i++) o[i] = -1;
    }
    free(idx); free(kept); free(su); free(sw);
    return 0;
}
