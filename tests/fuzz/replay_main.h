/* replay_main.h - main() of a fuzz target built as a standalone replayer
 * (FUZZ_REPLAY): runs LLVMFuzzerTestOneInput on each file named on the
 * command line (up to 4 MiB of it).  Included at the end of a target. */
#ifndef FUZZ_NAME
#error "define FUZZ_NAME before including replay_main.h"
#endif

int main(int argc, char **argv)
{
    int n = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            return 1;
        }
        static uint8_t buf[1 << 22];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, len);
        n++;
    }
    printf("%s replay: %d inputs, no crash\n", FUZZ_NAME, n);
    return 0;
}
