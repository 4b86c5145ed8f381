/* zipf.h - Zipf-distributed integers in O(1) time and memory whatever the range (10^8 values
 * need no table): rejection-inversion sampling, Hörmann and Derflinger, "Rejection-inversion
 * to generate variates from monotone discrete distributions", ACM TOMACS 6(3), 1996. */
#ifndef FLEET_ZIPF_H
#define FLEET_ZIPF_H

#include "fleet/rng.h"

#include <stdint.h>

typedef struct {
    int64_t n;    /* values 1..n */
    double  s;    /* exponent: P(k) proportional to k^-s */
    double  h_x1; /* H(1.5) - h(1) */
    double  h_n;  /* H(n + 0.5) */
    double  sval; /* the squeeze: 2 - H^-1(H(2.5) - h(2)) */
} fl_zipf;

/* Sets up the law over 1..n (n >= 1) with exponent s > 0 (s = 1 included). FL_EINVAL else. */
int     fl_zipf_init(fl_zipf *z, int64_t n, double s);
/* One draw in [1, n] from r (a variable number of r's words: about one in expectation). */
int64_t fl_zipf_sample(const fl_zipf *z, fl_rng *r);

#endif /* FLEET_ZIPF_H */
