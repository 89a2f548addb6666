/*
 * run_report.c - the report of `engram run`: text for people, closed by a
 * legend, or one JSON object with a "definitions" object that says what
 * each read figure covers (run_engine.c measures them).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "run.h"

/* What each read figure covers: the JSON's "definitions", the text's legend. */
static const char *const def_dec[][2] = {
    {"decode.read_span_ns", "Sum over decode steps of the latest ready_ns of any table of any session in "
     "the step (engram_step_get_info) minus the step's begin_ns (the earliest of its sessions')."},
    {"decode.exposed_wait_ns", "Sum over decode steps of the engine thread's wall time inside "
     "engram_step_wait calls (both tables, all sessions) that falls inside the step's read span."},
    {"decode.hidden_ns", "read_span_ns - exposed_wait_ns: read time during which the engine thread was not "
     "inside a wait (running layers or applies, or not running at all)."},
    {"decode.hidden_in_begin_ns", "The part of hidden_ns during which the engine thread was still inside "
     "engram_step_begin_batch, after the step's begin_ns (queueing the reads and waking the I/O thread, "
     "which on a busy machine may take the engine's CPU): not hidden behind any layer."},
    {"decode.wait_outside_span_ns", "The rest of the time inside engram_step_wait, after the step's last "
     "row was in (wake-up, waits for rows already in); exposed_wait_ns + this = all time inside the waits."},
    {"decode.per_table.read_span_ns", "Per table t, the sum over steps of the latest ready_ns[t] minus the "
     "step's begin_ns; the two overlap in time and do not add up to read_span_ns."},
    {"decode.per_table.exposed_wait_ns", "Per table t, the time inside engram_step_wait(s, t) calls within "
     "[begin_ns, latest ready_ns[t]] of each step."},
};
static const char *const def_pre[][2] = {
    {"prefill.read_span_ns", "Sum over prompts of the time from the engram_prefill_begin call to the first "
     "moment the engine saw every chunk of both tables read: the return of the wait that got the last "
     "chunk, or a look at engram_prefill_ready (inside the layers' busy loops, around every wait and "
     "apply) that found them all read."},
    {"prefill.read_span_late_max_ns", "Sum over prompts of the most that read_span_ns (and so hidden_ns) "
     "may run past the last chunk's read: from the last look that found a chunk unread to the look that "
     "found all read, or to the entry of the wait that returned with the last chunk (that wait's wake-up "
     "is in both read_span_ns and exposed_wait_ns)."},
    {"prefill.exposed_wait_ns", "Sum over prompts of the engine thread's wall time inside "
     "engram_prefill_wait calls that falls inside the prompt's read span."},
    {"prefill.hidden_ns", "read_span_ns - exposed_wait_ns: read time during which the engine thread was not "
     "inside a wait."},
    {"prefill.hidden_in_begin_ns", "The part of hidden_ns the engine thread spent inside the "
     "engram_prefill_begin call."},
    {"prefill.wait_outside_span_ns", "Time inside engram_prefill_wait after the read span ended."},
};
static const char *const def_pre_serial[][2] = {
    {"prefill.read_span_ns", "Sum over the prompts' chunks of the time inside the serial engram_reader_batch "
     "calls (both tables) on the engine's thread (--no-prefetch)."},
    {"prefill.read_span_late_max_ns", "0: the serial reads are timed directly."},
    {"prefill.exposed_wait_ns", "Equal to read_span_ns: serial reads block the engine thread."},
    {"prefill.hidden_ns", "0: nothing runs beside serial reads."},
    {"prefill.hidden_in_begin_ns", "0: no prefill is begun."},
    {"prefill.wait_outside_span_ns", "0: no waits."},
};
#define NDEFS(a) (sizeof(a) / sizeof *(a))

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static const char *shard_mode(const struct run *R)
{
    return R->sh.world < 2 ? "one process" : R->sh.dp ? "dp" : "tp";
}

/* --shard: the ranks' figures (JSON: "shard":{...}). */
static void print_shard_json(const struct run *R, const struct report *o)
{
    const struct shard *sh = &R->sh;
    if (!sh->mp || !o->ranks)
        return;
    uint64_t dec_tokens = R->n_steps * R->B;
    printf(",\"shard\":{\"world\":%d,\"mode\":\"%s\",\"sessions\":%u,\"ranks\":[", sh->world,
           shard_mode(R), sh->sessions);
    for (int r = 0; r < sh->world; r++) {
        const uint64_t *k = o->ranks + (size_t)r * RK_FIELDS;
        printf("%s{\"rank\":%d,\"sessions\":%" PRIu64 ",\"decode_tokens\":%" PRIu64
               ",\"decode_rows_requested\":%" PRIu64 ",\"decode_rows_read\":%" PRIu64
               ",\"decode_rows_read_per_token\":%.3f,\"prefill_tokens\":%" PRIu64
               ",\"prefill_rows_read\":%" PRIu64 ",\"combine_bytes\":%" PRIu64
               ",\"decode_combine_ns\":%" PRIu64 ",\"decode_combine_exposed_ns\":%" PRIu64
               ",\"prefill_bytes_received\":%" PRIu64
               ",\"exchange_decode_rows_remote\":%" PRIu64 ",\"exchange_decode_rows_sent\":%" PRIu64
               ",\"exchange_prefill_rows_remote\":%" PRIu64 ",\"exchange_prefill_rows_sent\":%" PRIu64 "}",
               r ? "," : "", r, k[RK_SESSIONS], k[RK_DEC_TOKENS], k[RK_DEC_REQ], k[RK_DEC_READ],
               k[RK_DEC_TOKENS] ? (double)k[RK_DEC_READ] / (double)k[RK_DEC_TOKENS] : 0.0, k[RK_PRE_TOKENS],
               k[RK_PRE_READ], k[RK_COMB_BYTES], k[RK_COMB_TOTAL], k[RK_COMB_EXPOSED], k[RK_PRE_RECV],
               k[RK_X_DEC_REMOTE], k[RK_X_DEC_SENT], k[RK_X_PRE_REMOTE], k[RK_X_PRE_SENT]);
    }
    printf("],\"combine\":{\"method\":\"%s\",\"decode\":{\"calls\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"bytes_per_token\":%.1f,\"total_ns\":%" PRIu64 ",\"exposed_ns\":%" PRIu64 ",\"hidden_ns\":%" PRIu64
           ",\"late_ns\":%" PRIu64 ",\"complete_before_wait\":%" PRIu64
           "},\"prefill\":{\"calls\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"bytes_per_token\":%.1f,\"total_ns\":%" PRIu64
           ",\"exposed_ns\":%" PRIu64 ",\"hidden_ns\":%" PRIu64 ",\"late_ns\":%" PRIu64
           ",\"complete_before_wait\":%" PRIu64 ",\"method\":\"%s\",\"bytes_received\":%" PRIu64 "}}",
           sh->tp ? "MPI_Iallreduce BOR" : "none", sh->dec.calls, sh->dec.bytes,
           dec_tokens ? (double)sh->dec.bytes / (double)dec_tokens : 0.0, sh->dec.total_ns, sh->dec.exposed_ns,
           sh->dec.total_ns - sh->dec.exposed_ns, sh->dec.late_ns, sh->dec.early, sh->pre.calls, sh->pre.bytes,
           o->prompt_tokens ? (double)sh->pre.bytes / (double)o->prompt_tokens : 0.0, sh->pre.total_ns,
           sh->pre.exposed_ns, sh->pre.total_ns - sh->pre.exposed_ns, sh->pre.late_ns, sh->pre.early,
           !sh->tp ? "none" : sh->pgather ? "MPI_Iallgatherv" : "MPI_Iallreduce BOR", sh->pre_recv);
    /* --dp on shard files: this rank's exchanges (bytes: rows from other
     * ranks x (row + its 4 B request), the traffic its tokens cause) */
    printf(",\"exchange\":{\"used\":%s,\"decode\":{\"calls\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"bytes_per_token\":%.1f,\"total_ns\":%" PRIu64 ",\"exposed_ns\":%" PRIu64 "},\"prefill\":{\"calls\":%"
           PRIu64 ",\"bytes\":%" PRIu64 ",\"bytes_per_token\":%.1f,\"total_ns\":%" PRIu64 ",\"exposed_ns\":%" PRIu64
           "}}", sh->xdp ? "true" : "false", sh->xdec.calls, sh->xdec.bytes,
           dec_tokens ? (double)sh->xdec.bytes / (double)dec_tokens : 0.0, sh->xdec.total_ns, sh->xdec.exposed_ns,
           sh->xpre.calls, sh->xpre.bytes, o->prompt_tokens ? (double)sh->xpre.bytes / (double)o->prompt_tokens : 0.0,
           sh->xpre.total_ns, sh->xpre.exposed_ns);
    printf(",\"checksums_agree\":%s}", !sh->tp ? "null" : o->checksums_agree ? "true" : "false");
}

/* One kind of combine's times (text). */
static void print_comb(const char *what, const struct comb *c)
{
    printf("         %s: begin to completion %.3f ms (completion seen at most %.3f ms late), exposed "
           "(waiting) %.3f ms, hidden %.3f ms (%.1f%%); %" PRIu64 " of %" PRIu64 " complete before their wait\n",
           what, (double)c->total_ns / 1e6, (double)c->late_ns / 1e6, (double)c->exposed_ns / 1e6,
           (double)(c->total_ns - c->exposed_ns) / 1e6, pct(c->total_ns - c->exposed_ns, c->total_ns), c->early,
           c->calls);
}

/* --shard: the ranks' figures (text). */
static void print_shard_text(const struct run *R, const struct report *o)
{
    const struct shard *sh = &R->sh;
    if (!sh->mp || !o->ranks)
        return;
    if (sh->world < 2) {
        printf("shard:   one rank (no mpirun?): --shard ran as a plain one-process run\n");
        return;
    }
    printf("shard:   %d ranks, %s: %s; the figures above are rank 0's\n", sh->world,
           sh->dp ? "DP" : "TP", sh->xdp ? "rank r runs sessions r, r + N, ... on its shard file, rows "
                                           "from their owners (the exchange)"
                                 : sh->dp ? "rank r runs sessions r, r + N, ... on an unsharded pool"
                                          : "every rank the same sessions, its row block read, rows combined");
    for (int r = 0; r < sh->world; r++) {
        const uint64_t *k = o->ranks + (size_t)r * RK_FIELDS;
        printf("         rank %d: %" PRIu64 " session%s; decode %" PRIu64 " rows read for %" PRIu64
               " tokens = %.2f per token (of %u); prefill %" PRIu64 " rows read\n", r, k[RK_SESSIONS],
               k[RK_SESSIONS] == 1 ? "" : "s", k[RK_DEC_READ], k[RK_DEC_TOKENS],
               k[RK_DEC_TOKENS] ? (double)k[RK_DEC_READ] / (double)k[RK_DEC_TOKENS] : 0.0, R->rpt,
               k[RK_PRE_READ]);
    }
    if (sh->tp) {
        uint64_t dec_tokens = R->n_steps * R->B;
        printf("combine: MPI_Iallreduce (bitwise OR) per table per step, rank 0: decode %" PRIu64
               " calls, %.0f bytes per token combined (each rank receives 2(N-1)/N to log2(N) times "
               "that, by MPI's algorithm),\n", sh->dec.calls,
               dec_tokens ? (double)sh->dec.bytes / (double)dec_tokens : 0.0);
        print_comb("decode", &sh->dec);
        if (sh->pgather)
            printf("         prefill: MPI_Iallgatherv of each rank's owned rows, %" PRIu64 " calls (one per "
                   "chunk and table, begun when the chunk's rows are read), %.0f bytes per token, of which "
                   "rank 0 received %.0f,\n", sh->pre.calls,
                   o->prompt_tokens ? (double)sh->pre.bytes / (double)o->prompt_tokens : 0.0,
                   o->prompt_tokens ? (double)sh->pre_recv / (double)o->prompt_tokens : 0.0);
        else
            printf("         prefill: MPI_Iallreduce (bitwise OR), %" PRIu64 " calls (one per chunk and table, "
                   "begun when the chunk's rows are read), %.0f bytes per token combined,\n", sh->pre.calls,
                   o->prompt_tokens ? (double)sh->pre.bytes / (double)o->prompt_tokens : 0.0);
        print_comb("prefill", &sh->pre);
        printf("         every rank's residuals %s\n", o->checksums_agree ? "the same" : "NOT THE SAME");
    } else {
        printf("         checksum: chained across the ranks in session order\n");
    }
    if (sh->xdp) {
        uint64_t dec_tokens = R->n_steps * R->B;
        printf("exchange: rows asked of their owners (4 B a row out, the row back), rank 0: decode %" PRIu64
               " exchanges, %.0f bytes per token moved, %.3f ms in all, %.3f ms exposed; prefill %" PRIu64
               " exchanges, %.0f bytes per token, %.3f ms\n", sh->xdec.calls,
               dec_tokens ? (double)sh->xdec.bytes / (double)dec_tokens : 0.0, (double)sh->xdec.total_ns / 1e6,
               (double)sh->xdec.exposed_ns / 1e6, sh->xpre.calls,
               o->prompt_tokens ? (double)sh->xpre.bytes / (double)o->prompt_tokens : 0.0,
               (double)sh->xpre.total_ns / 1e6);
        for (int r = 0; r < sh->world; r++) {
            const uint64_t *k = o->ranks + (size_t)r * RK_FIELDS;
            printf("         rank %d: decode %" PRIu64 " rows from others, %" PRIu64 " sent to others; prefill %"
                   PRIu64 " from, %" PRIu64 " to\n", r, k[RK_X_DEC_REMOTE], k[RK_X_DEC_SENT], k[RK_X_PRE_REMOTE],
                   k[RK_X_PRE_SENT]);
        }
    }
}

void run_print_json(const struct run *R, const struct report *o)
{
    const engram_pool_stats *ps = &o->ps;
    double pre_s = (double)R->prefill_ns / 1e9, dec_s = (double)R->decode_ns / 1e9;
    size_t dec_tokens = R->n_steps * R->B;
    printf("{\"model\":");
    cli_json_string(stdout, o->path);
    printf(",\"device\":");
    cli_json_string(stdout, o->device);
    printf(",\"sessions\":%u,\"layers\":%u,\"layer_us\":%" PRIu64 ",\"threads\":%" PRIu64
           ",\"overlap\":%s,\"prefetch\":%s,\"width\":%u,\"streams\":%u",
           R->B, R->layers, o->layer_us, o->threads, R->overlap ? "true" : "false",
           R->prefetch ? "true" : "false", o->li.width, o->li.streams);
    printf(",\"member\":\"%s\",\"rows_per_token\":%u,\"engram_layers\":[%u",
           R->ple ? "qwen3.8-ple" : "deepseek-v4.1-engram", R->rpt, R->at[0]);
    if (R->tables > 1)
        printf(",%u", R->at[1]);
    printf("]");
    printf(",\"prefill\":{\"tokens\":%zu,\"seconds\":%.6f,\"tokens_per_s\":%.2f,\"rows_requested\":%" PRIu64
           ",\"rows_read\":%" PRIu64 ",\"chunks\":%" PRIu64 ",\"read_span_ns\":%" PRIu64
           ",\"read_span_late_max_ns\":%" PRIu64 ",\"exposed_wait_ns\":%" PRIu64 ",\"hidden_ns\":%" PRIu64
           ",\"hidden_in_begin_ns\":%" PRIu64 ",\"wait_outside_span_ns\":%" PRIu64 "}",
           o->prompt_tokens, pre_s, pre_s > 0 ? (double)o->prompt_tokens / pre_s : 0.0,
           ps->prefill_rows_requested, ps->prefill_rows_read, ps->prefill_chunks, R->pre.span_ns,
           R->pre.late_ns, R->pre.exposed_ns, R->pre.span_ns - R->pre.exposed_ns, R->pre.in_begin_ns,
           R->pre.outside_ns);
    printf(",\"decode\":{\"steps\":%zu,\"tokens\":%zu,\"seconds\":%.6f,\"tokens_per_s\":%.2f,"
           "\"step_p50_ns\":%" PRIu64 ",\"step_p99_ns\":%" PRIu64 ",\"rows_requested\":%" PRIu64
           ",\"rows_read\":%" PRIu64 ",\"rounds\":%" PRIu64 ",\"read_span_ns\":%" PRIu64
           ",\"exposed_wait_ns\":%" PRIu64 ",\"hidden_ns\":%" PRIu64 ",\"hidden_in_begin_ns\":%" PRIu64
           ",\"wait_outside_span_ns\":%" PRIu64 ",\"per_table\":{\"read_span_ns\":[%" PRIu64,
           R->n_steps, dec_tokens, dec_s, dec_s > 0 ? (double)dec_tokens / dec_s : 0.0, o->p50, o->p99,
           ps->step_rows_requested, ps->step_rows_read, ps->rounds, R->dec.span_ns, R->dec.exposed_ns,
           R->dec.span_ns - R->dec.exposed_ns, R->dec.in_begin_ns, R->dec.outside_ns, R->dec_read_t[0]);
    if (R->tables > 1)
        printf(",%" PRIu64, R->dec_read_t[1]);
    printf("],\"exposed_wait_ns\":[%" PRIu64, R->dec_exposed_t[0]);
    if (R->tables > 1)
        printf(",%" PRIu64, R->dec_exposed_t[1]);
    printf("]}}");
    printf(",\"inconsistent\":%u,\"definitions\":{", R->inconsistent);
    const char *const(*pre)[2] = R->prefetch ? def_pre : def_pre_serial;
    size_t n_pre = R->prefetch ? NDEFS(def_pre) : NDEFS(def_pre_serial);
    for (size_t i = 0; i < NDEFS(def_dec) + n_pre; i++) {
        const char *const *d = i < NDEFS(def_dec) ? def_dec[i] : pre[i - NDEFS(def_dec)];
        printf("%s", i ? "," : "");
        cli_json_string(stdout, d[0]);
        putchar(':');
        cli_json_string(stdout, d[1]);
    }
    printf(",\"inconsistent\":");
    cli_json_string(stdout, "Steps or prompts whose timestamps contradict the definitions (a ready time or "
                        "a wait before the begin, a prefill never seen complete): left out of every "
                        "figure, never clamped; 0 expected.");
    printf("},\"io\":{\"engine\":");
    cli_json_string(stdout, ps->io.engine);
    printf(",\"direct\":%d,\"note\":", ps->io.direct);
    cli_json_string(stdout, ps->io.note);
    printf(",\"host_registered\":%" PRIu64 "},\"page_cache_growth_pages\":", ps->io.host_registered);
    if (o->count_err) {
        printf("null,\"page_cache_error\":");
        cli_json_string(stdout, strerror(-o->count_err));
    } else {
        printf("%" PRId64, o->growth);
    }
    print_shard_json(R, o);
    printf(",\"checksum\":\"%016" PRIx64 "\"}\n", o->fnv);
}

/* The report for people; the legend says what the read figures cover. */
void run_print_text(const struct run *R, const struct report *o)
{
    const engram_pool_stats *ps = &o->ps;
    double pre_s = (double)R->prefill_ns / 1e9, dec_s = (double)R->decode_ns / 1e9;
    char where[64];
    if (R->ple)
        snprintf(where, sizeof where, "the PLE layer at %u", R->at[0]);
    else
        snprintf(where, sizeof where, "Engram at 1 and 14");
    printf("engram run: %s, W %u, %u streams; %u sessions, %u layers of %" PRIu64
           " us (%s on the %s), %" PRIu64 " apply thread%s%s%s\n",
           o->path, o->li.width, o->li.streams, R->B, R->layers, o->layer_us, where, o->device, o->threads,
           o->threads > 1 ? "s" : "", R->overlap ? "" : ", reads waited before layer 0",
           R->prefetch ? "" : ", no prefetch");
    printf("prefill: %zu tokens in %.3f s = %.1f tokens/s; %" PRIu64 " rows requested, %" PRIu64
           " distinct read (%" PRIu64 " chunks)%s\n",
           o->prompt_tokens, pre_s, pre_s > 0 ? (double)o->prompt_tokens / pre_s : 0.0,
           ps->prefill_rows_requested, ps->prefill_rows_read, ps->prefill_chunks,
           R->prefetch ? "" : " (the serial readers' rows are not counted here)");
    if (R->prefetch)
        printf("         reads: span %.3f ms (end seen at most %.1f us late), exposed %.3f ms, hidden %.3f ms "
               "(%.1f%%; %.3f ms of it in the begin call); waiting after the span %.3f ms\n",
               (double)R->pre.span_ns / 1e6, (double)R->pre.late_ns / 1e3, (double)R->pre.exposed_ns / 1e6,
               (double)(R->pre.span_ns - R->pre.exposed_ns) / 1e6,
               pct(R->pre.span_ns - R->pre.exposed_ns, R->pre.span_ns), (double)R->pre.in_begin_ns / 1e6,
               (double)R->pre.outside_ns / 1e6);
    else
        printf("         reads: serial, on the engine's thread: %.3f ms, all exposed\n",
               (double)R->pre.span_ns / 1e6);
    printf("decode:  %zu steps x %u sessions in %.3f s = %.1f tokens/s; step p50 %.3f ms, p99 %.3f ms\n",
           R->n_steps, R->B, dec_s, dec_s > 0 ? (double)(R->n_steps * R->B) / dec_s : 0.0,
           (double)o->p50 / 1e6, (double)o->p99 / 1e6);
    printf("         rows: %u per token; %" PRIu64 " requested, %" PRIu64 " distinct read (%.1f%% saved by merging "
           "sessions' reads), %" PRIu64 " rounds\n", R->rpt, ps->step_rows_requested, ps->step_rows_read,
           ps->step_rows_requested ? 100.0 - pct(ps->step_rows_read, ps->step_rows_requested) : 0.0,
           ps->rounds);
    printf("         reads: span %.3f ms, exposed %.3f ms, hidden %.3f ms (%.1f%%; %.3f ms of it in the "
           "begin call); waiting after the last row %.3f ms\n", (double)R->dec.span_ns / 1e6,
           (double)R->dec.exposed_ns / 1e6, (double)(R->dec.span_ns - R->dec.exposed_ns) / 1e6,
           pct(R->dec.span_ns - R->dec.exposed_ns, R->dec.span_ns), (double)R->dec.in_begin_ns / 1e6,
           (double)R->dec.outside_ns / 1e6);
    if (R->tables > 1)
        printf("         per table (spans overlap, no sum): table 0 span %.3f ms, exposed %.3f ms; "
               "table 1 span %.3f ms, exposed %.3f ms\n", (double)R->dec_read_t[0] / 1e6,
               (double)R->dec_exposed_t[0] / 1e6, (double)R->dec_read_t[1] / 1e6,
               (double)R->dec_exposed_t[1] / 1e6);
    const char *note = ps->io.note && ps->io.note[0] ? ps->io.note : NULL;
    printf("io:      %s%s%s%s%s; page cache of the tables ", ps->io.engine,
           ps->io.direct ? ", O_DIRECT" : ", buffered", note ? " (" : "", note ? note : "", note ? ")" : "");
    if (o->count_err)
        printf("not counted (%s: %s)\n", o->path, strerror(-o->count_err));
    else
        printf("grew by %" PRId64 " pages\n", o->growth);
    if (ps->io.host_registered)
        printf("         the reader's buffers (%" PRIu64 " KiB, where reads land) and the prefill "
               "ring page-locked for the GPU's copies\n", ps->io.host_registered >> 10);
    print_shard_text(R, o);
    printf("checksum of the final residuals (FNV-1a 64): %016" PRIx64 "\n", o->fnv);
    printf("legend:  decode span = per step, from its begin to its last row of either table\n"
           "         (engram_step_get_info), summed; prefill span = from engram_prefill_begin to the\n"
           "         engine seeing the last chunk of both tables read; exposed = the engine's time inside\n"
           "         the waits within the span; hidden = span - exposed; --json: \"definitions\"\n");
    if (R->inconsistent)
        printf("warning: %u steps or prompts had timestamps that contradict the definitions; left out\n",
               R->inconsistent);
}
