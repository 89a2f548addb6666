/*
 * test_version.c - the version macros, the string and engram_version()
 * agree: MAJOR.MINOR.PATCH joined by dots is ENGRAM_VERSION, which is what
 * the library reports.
 */
#include <stdio.h>

#include "testutil.h"

int main(void)
{
    char composed[64];
    snprintf(composed, sizeof composed, "%d.%d.%d", ENGRAM_VERSION_MAJOR, ENGRAM_VERSION_MINOR,
             ENGRAM_VERSION_PATCH);
    CHECK(strcmp(composed, ENGRAM_VERSION) == 0);
    CHECK(engram_version() != NULL);
    CHECK(strcmp(engram_version(), ENGRAM_VERSION) == 0);
    CHECK(engram_version() == engram_version()); /* a static string */
    CHECK(ENGRAM_VERSION_MAJOR >= 0 && ENGRAM_VERSION_MINOR >= 0 && ENGRAM_VERSION_PATCH >= 0);
    printf("engram %s (headers %s)\n", engram_version(), ENGRAM_VERSION);
    return tu_finish("test_version");
}
