/* CPU emulation of dec16_probe's two routes (both written from row_decode.cuh's code and SPEC section 7) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static uint16_t h(float f) { _Float16 x = (_Float16)f; uint16_t u; memcpy(&u, &x, 2); return u; }
static float slow(unsigned mm, int ex, unsigned sign) {
    float v = ldexpf((float)mm, ex); uint32_t u = f2u(v);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; return u2f(u | sign);
}
static float decode1(unsigned c, int sc) {
    unsigned e = (c >> 3) & 15u, m = c & 7u, sign = (c & 0x80u) << 24;
    unsigned mm = e ? 8u + m : m; int ex = (e ? (int)e - 10 : -9) + sc - 127;
    if (mm == 0) return u2f(sign);
    int lead = 31 - __builtin_clz(mm); int field = lead + ex + 127;
    if (field < 1) return slow(mm, ex, sign);
    return u2f(sign | ((unsigned)field << 23) | ((mm << (23 - lead)) & 0x7fffffu));
}
/* E4M3FN by SPEC section 7's definition (no NaN codes passed) */
static float e4m3(unsigned c) {
    unsigned e = (c >> 3) & 15u, m = c & 7u; float v = e ? ldexpf(1.0f + m / 8.0f, (int)e - 7) : ldexpf(m / 8.0f, -6);
    return (c & 0x80u) ? -v : v;
}
int main(void) {
    long cases = 0, bad = 0, bad_reach = 0, reach = 0; int fmin = 999, fmax = -999;
    for (unsigned pair = 0; pair < 65536; pair++) {
        unsigned b0 = pair & 0xff, b1 = pair >> 8;
        if ((b0 & 0x7f) == 0x7f || (b1 & 0x7f) == 0x7f) continue;
        int zero = !(b0 & 0x7f) && !(b1 & 0x7f);
        for (int f = zero ? -40 : 1; f <= (zero ? 300 : 254); f++) {
            uint16_t o0 = h(decode1(b0, f)), o1 = h(decode1(b1, f));
            int fc = f < 1 ? 1 : f > 254 ? 254 : f; float mf = u2f((uint32_t)fc << 23);
            uint16_t n0 = h(e4m3(b0) * mf), n1 = h(e4m3(b1) * mf);
            int d = o0 != n0 || o1 != n1; cases++; bad += d;
            int r = zero || (f >= 112 && f <= 133); reach += r; bad_reach += r && d;
            if (d) { if (f < fmin) fmin = f; if (f > fmax) fmax = f; }
        }
        if (zero) for (int f = -121; f <= 387; f++) { /* the zero blocks' whole reachable range */
            int fc = f < 1 ? 1 : f > 254 ? 254 : f; float mf = u2f((uint32_t)fc << 23);
            int d = h(decode1(b0, f)) != h(e4m3(b0) * mf) || h(decode1(b1, f)) != h(e4m3(b1) * mf);
            reach++; bad_reach += d;
        }
    }
    printf("probe domain: %ld cases, %ld differ (f of the differing: %d..%d); reachable (nonzero codes f 112..133, zero pairs f -121..387): %ld cases, %ld differ\n", cases, bad, fmin, fmax, reach, bad_reach);
    return 0;
}
