/* error.c - the one error convention: 0 or a negative errno, plus
 * engram_error; engram_strerror() names the codes (util.c fills errors). */
#include <errno.h>
#include <string.h>

#include "util.h"

const char *engram_strerror(int code)
{
    switch (code) {
    case 0: return "success";
    case -EINVAL: return "invalid argument";
    case -EBADMSG: return "malformed or inconsistent model file";
    case -EDOM: return "row does not decode (NaN or non-finite value)";
    case -EIO: return "I/O error or short read";
    case -ENOMEM: return "out of memory";
    case -ENOTSUP: return "not an Engram model of the supported dialect";
    case -ERANGE: return "value out of range";
    case -ESTALE: return "the model's file was replaced since it was opened";
    case -ECANCELED: return "cancelled";
    case -ETIMEDOUT: return "timed out (nothing lost: wait again)";
    case -EDEADLK: return "this wait could never return";
    case -ESHUTDOWN: return "the pool was closed";
    default: break;
    }
    if (code < 0) {
        /* strerror may use a shared buffer; these texts are stable in glibc. */
        return strerror(-code);
    }
    return "unknown error";
}
