/* half.c - IEEE binary16 and bfloat16 conversion, round to nearest even.
 * Bit manipulation only, so results are the same on every machine and compiler. */
#include "fleet/tensor.h"

#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t fl_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;

    if (exp == 0xff) /* inf or NaN; keep NaN quiet and non-zero */
        return (uint16_t)(sign | 0x7c00u | (man ? (0x200u | (man >> 13)) : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) /* overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal or zero in f16 */
        if (e < -10)
            return sign;
        man |= 0x800000u; /* implicit leading one */
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
        half++; /* may carry into the exponent, up to inf: correct */
    return (uint16_t)(sign | half);
}

float fl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: value = man * 2^-24, exact in f32 */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

uint16_t fl_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu))
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}

float fl_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

void fl_f32_to_f16_n(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = fl_f32_to_f16(src[i]);
}

void fl_f16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = fl_f16_to_f32(src[i]);
}

void fl_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = fl_f32_to_bf16(src[i]);
}

void fl_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = fl_bf16_to_f32(src[i]);
}
