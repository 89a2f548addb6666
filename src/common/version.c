/* version.c - the version of the library as built, for programs that want
 * to know which libengram.so they run with. */
#include "engram.h"

const char *engram_version(void)
{
    return ENGRAM_VERSION;
}
