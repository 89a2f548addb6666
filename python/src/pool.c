/* pool.c - engram.Pool, Session, Step, Prefill (in progress) */
#include "ext.h"

int eg_pool_init(PyObject *module)
{
    (void)module;
    return 0;
}
