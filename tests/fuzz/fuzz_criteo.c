/* fuzz_criteo.c - libFuzzer target for the Criteo line parser (src/data/criteo_line.c): any
 * bytes go through fl_criteo_parse_line, and whatever it does must keep its contract: an
 * accepted line appends exactly one sample (label 0 or 1, finite dense values, offsets that
 * never decrease, every id carrying its slot in the high bits), a refused one (FL_EFORMAT)
 * leaves the batch as it was. The first byte picks the format's options (missing ids, the
 * dense transform), the rest is the line. Built by tests/fuzz/CMakeLists.txt with clang
 * -fsanitize=fuzzer,address,undefined. */
#include "fleet/ctr.h"
#include "fleet/status.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1)
        return 0;
    fl_criteo_format f = fl_criteo_format_default();
    f.missing_id = data[0] & 1;
    f.transform = (fl_ctr_dense_transform)((data[0] >> 1) % 3);
    fl_ctr_batch b;
    if (fl_ctr_batch_init(&b, f.ndense, f.nslots, 2, 64) < 0)
        abort();
    /* one good sample first, so that "unchanged" is checked against a batch that holds one */
    static const char good[] = "1\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\ta\tb\tc\td\te\tf\t1\t2"
                               "\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t14\t15\t16\t17\t18\t19\t20";
    if (fl_criteo_parse_line(&f, good, sizeof good - 1, &b) != 0)
        abort();
    int64_t bags = b.batch * b.nslots, ids = b.offsets[bags];
    int rc = fl_criteo_parse_line(&f, (const char *)data + 1, n - 1, &b);
    if (rc == FL_EFORMAT || rc == FL_ENOMEM) {
        if (b.batch != 1 || b.offsets[bags] != ids)
            abort(); /* a refused line changed the batch */
    } else if (rc == 0) {
        if (b.batch != 2 || (b.labels[1] != 0 && b.labels[1] != 1))
            abort();
        for (int j = 0; j < b.ndense; j++)
            if (!isfinite(b.dense[b.ndense + j]))
                abort();
        for (int s = 0; s < b.nslots; s++) {
            int64_t k = b.nslots + s;
            if (b.offsets[k + 1] < b.offsets[k])
                abort();
            for (int64_t i = b.offsets[k]; i < b.offsets[k + 1]; i++)
                if ((int)(b.ids[i] >> FL_CTR_HASH_BITS) != s)
                    abort();
        }
    } else {
        abort(); /* only FL_EFORMAT and FL_ENOMEM are failures of a line */
    }
    fl_ctr_batch_free(&b);
    return 0;
}
