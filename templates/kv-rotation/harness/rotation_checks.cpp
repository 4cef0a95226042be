// portkit's validation harness: everything `portkit validate` measures of the KV-cache
// rotation, through the public llama.h API of the tree under test. portkit builds it against
// the tree's own libllama, so no tool of the tree (llama-perplexity, llama-bench) is needed.
//
//   rotation_checks base  MODEL TEXT CTK CTV OUT    perplexity of the text; writes the scored
//                                                   tokens' log-probabilities to OUT
//   rotation_checks kld   MODEL TEXT CTK CTV BASE   perplexity, KL divergence and top-1
//                                                   agreement against the log-probabilities in BASE
//   rotation_checks shift MODEL TEXT CTK CTV        shifted cache vs a cache filled fresh
//   rotation_checks state MODEL TEXT CTK CTV        session saved with rotation off/on, loaded with on/off
//   rotation_checks speed MODEL TEXT CTK CTV THREADS N_PROMPT N_GEN REPS
//                                                   prompt and generation tokens per second
//
// CTK/CTV: f16, q8_0 or q4_0. Results are printed as `key=value` lines on stdout for portkit
// to parse; the library's log goes to stderr (portkit keeps it: it holds the lines that say
// whether the cache rotates). The env var LLAMA_ATTN_ROT_DISABLE is read by the cache
// constructor, so the state check sets it around context creation to save with one setting
// and load with the other.
//
// `base` and `kld` measure the way llama-perplexity does with `-c 512 --chunks 8 -b 2048
// -t 2 -fa on` (its --kl-divergence-base and --kl-divergence runs): chunks of 512 tokens, four
// chunks side by side in one batch of 2048 (one sequence each, a context of 4 x 512 cells),
// the first half of each chunk unscored, the first token of a chunk replaced by BOS when the
// vocabulary adds one. The base keeps each scored token's log-probabilities as 16-bit steps
// between the lowest kept (at most 16 below the highest) and the highest, and the divergence
// is summed over the tokens whose base log-probability is above -16, in the same float and
// double arithmetic: the figures equal llama-perplexity's to every digit it prints.

#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int CHUNK      = 512;  // tokens per chunk (llama-perplexity -c)
constexpr int N_CHUNKS   = 8;    // chunks measured (--chunks)
constexpr int N_BATCH    = 2048; // logical batch (-b); CHUNK-sized chunks side by side
constexpr int N_UBATCH   = 512;  // physical batch (-ub, the default)
constexpr int N_THREADS  = 2;    // -t
constexpr int N_FILL     = 320;  // tokens in the cache before the shift
constexpr int N_DROP     = 128;  // tokens the shift drops from the front
constexpr int N_EVAL     = 32;   // tokens evaluated after the shift / after loading a state
constexpr float KEEP_BELOW_MAX = 16.0f;  // log-probabilities kept in the base: down to max - 16

const char BASE_MAGIC[8] = {'P', 'K', 'B', 'A', 'S', 'E', '0', '1'};

[[noreturn]] void die(const char * what) {
    fprintf(stderr, "rotation_checks: %s\n", what);
    exit(2);
}

ggml_type parse_type(const char * s) {
    if (!strcmp(s, "f16"))  return GGML_TYPE_F16;
    if (!strcmp(s, "q8_0")) return GGML_TYPE_Q8_0;
    if (!strcmp(s, "q4_0")) return GGML_TYPE_Q4_0;
    die("cache type must be f16, q8_0 or q4_0");
}

struct Setup {
    llama_model * model = nullptr;
    const llama_vocab * vocab = nullptr;
    std::vector<llama_token> tokens;
    ggml_type type_k = GGML_TYPE_F16;
    ggml_type type_v = GGML_TYPE_F16;
    int n_vocab = 0;
};

void set_rotation_env(bool disabled) {
    if (disabled) {
        setenv("LLAMA_ATTN_ROT_DISABLE", "1", 1);
    } else {
        unsetenv("LLAMA_ATTN_ROT_DISABLE");
    }
}

llama_context_params context_params(const Setup & s, int n_ctx, int n_batch, int n_seq,
                                    int n_threads) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = n_ctx;
    cp.n_batch         = n_batch;
    cp.n_ubatch        = N_UBATCH;
    cp.n_seq_max       = n_seq;
    cp.n_threads       = n_threads;
    cp.n_threads_batch = n_threads;
    cp.type_k          = s.type_k;
    cp.type_v          = s.type_v;
    cp.swa_full        = false;  // as llama.cpp's tools set it (the library defaults to true)
    cp.kv_unified      = false;
#ifdef PORTKIT_FLASH_ATTN_BOOL
    cp.flash_attn = true;
#else
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
#endif
    return cp;
}

llama_context * open_context(const Setup & s, const llama_context_params & cp) {
    llama_context * ctx = llama_init_from_model(s.model, cp);
    if (ctx == nullptr) {
        die("cannot create a context");
    }
    return ctx;
}

// the context of the shift and state checks, with the rotation set through the environment
llama_context * new_context(const Setup & s, bool rotation_disabled) {
    set_rotation_env(rotation_disabled);
    return open_context(s, context_params(s, 1024, 512, 1, N_THREADS));
}

// One decode of BOS and EOS, then an empty cache: what the tools do before they measure.
void warm_up(llama_context * ctx, const Setup & s) {
    std::vector<llama_token> tmp;
    if (llama_vocab_bos(s.vocab) != LLAMA_TOKEN_NULL) tmp.push_back(llama_vocab_bos(s.vocab));
    if (llama_vocab_eos(s.vocab) != LLAMA_TOKEN_NULL) tmp.push_back(llama_vocab_eos(s.vocab));
    if (tmp.empty()) tmp.push_back(0);
    llama_set_warmup(ctx, true);
    if (llama_decode(ctx, llama_batch_get_one(tmp.data(), (int32_t) tmp.size())) != 0) {
        die("the warm-up decode failed");
    }
    llama_memory_clear(llama_get_memory(ctx), true);
    llama_synchronize(ctx);
    llama_set_warmup(ctx, false);
}

// decode tokens[from, to) at positions pos0..; logits for all of them when `logits`
void decode(llama_context * ctx, const std::vector<llama_token> & tokens, int from, int to,
            int pos0, bool logits) {
    llama_batch batch = llama_batch_init(to - from, 0, 1);
    for (int i = from; i < to; ++i) {
        const int j = i - from;
        batch.token[j]     = tokens[i];
        batch.pos[j]       = pos0 + j;
        batch.n_seq_id[j]  = 1;
        batch.seq_id[j][0] = 0;
        batch.logits[j]    = logits;
    }
    batch.n_tokens = to - from;
    if (llama_decode(ctx, batch) != 0) {
        die("llama_decode failed");
    }
    llama_batch_free(batch);
}

std::vector<float> logits_of(llama_context * ctx, int n_tokens, int n_vocab) {
    const float * p = llama_get_logits(ctx);
    return std::vector<float>(p, p + (size_t) n_tokens * n_vocab);
}

// -- perplexity and KL divergence over chunks ------------------------------------------------

// FNV-1a over the bits of every scored logit: equal digests, bit-identical logits.
struct Digest {
    uint64_t h = 1469598103934665603ULL;
    void add(const float * values, int n) {
        for (int i = 0; i < n; ++i) {
            uint32_t bits;
            memcpy(&bits, values + i, sizeof bits);
            h = (h ^ bits) * 1099511628211ULL;
        }
    }
};

// What the softmax of one row of logits needs: its largest logit (the first such index) and
// log(sum(exp(logit - largest))), summed in double over float exponentials.
struct Row {
    float max_logit;
    int imax;
    float log_sum_exp;
};

Row row_of(const float * logits, int n_vocab) {
    Row r{logits[0], 0, 0.0f};
    for (int i = 1; i < n_vocab; ++i) {
        if (logits[i] > r.max_logit) {
            r.max_logit = logits[i];
            r.imax = i;
        }
    }
    double sum = 0.0;
    for (int i = 0; i < n_vocab; ++i) {
        sum += expf(logits[i] - r.max_logit);
    }
    r.log_sum_exp = (float) log(sum);
    return r;
}

// One scored token of the base: its log-probabilities as steps of `scale` above `floor`
// (16-bit, rounded to nearest, ties to even); logits below the kept range are step 0.
struct BaseRow {
    float scale;
    float floor;
    std::vector<uint16_t> steps;
};

float quantize_row(const float * logits, int n_vocab, BaseRow & out) {
    const Row r = row_of(logits, n_vocab);
    float lowest = logits[0];
    for (int i = 1; i < n_vocab; ++i) {
        lowest = std::min(lowest, logits[i]);
    }
    lowest = std::max(lowest, r.max_logit - KEEP_BELOW_MAX);
    out.floor = lowest - r.max_logit - r.log_sum_exp;
    out.scale = (r.max_logit - lowest) / 65535.f;
    out.steps.assign(n_vocab, 0);
    if (out.scale != 0.0f) {
        const float per_step = 1 / out.scale;
        for (int i = 0; i < n_vocab; ++i) {
            if (logits[i] > lowest) {
                out.steps[i] = (uint16_t) lrintf(per_step * (logits[i] - lowest));
            }
        }
    }
    return r.max_logit + r.log_sum_exp;  // log of the softmax's denominator
}

struct Totals {
    double nll = 0.0, nll_base = 0.0, kld = 0.0, kld2 = 0.0;
    long same_top = 0, count = 0;
};

void compare_row(const float * logits, int n_vocab, const BaseRow & base, llama_token next,
                 Totals & t) {
    const Row r = row_of(logits, n_vocab);
    const float nll = r.max_logit + r.log_sum_exp - logits[next];
    t.nll += nll;
    const float nll_base = -(base.scale * base.steps[next] + base.floor);
    t.nll_base += nll_base;
    const float log_norm = r.max_logit + r.log_sum_exp;
    double kld = 0.0;
    int imax_base = -1;
    float best_base = 0.0f;
    for (int i = 0; i < n_vocab; ++i) {
        const float log_p_base = base.scale * base.steps[i] + base.floor;
        if (i == 0 || log_p_base > best_base) {
            best_base = log_p_base;
            imax_base = i;
        }
        if (log_p_base > -KEEP_BELOW_MAX) {
            const float p_base = expf(log_p_base);
            kld += p_base * (log_p_base - logits[i] + log_norm);
        }
    }
    t.kld += kld;
    t.kld2 += kld * kld;
    t.same_top += r.imax == imax_base;
    ++t.count;
}

int n_seq_side_by_side() {
    return std::max(1, N_BATCH / CHUNK);
}

// Evaluate `n_chunk` chunks of `tokens`, n_seq_side_by_side() at a time; for every scored
// token, in order, call score(its row of logits, the token that follows it).
template <class Score>
void for_each_scored(const Setup & s, const std::vector<llama_token> & tokens, int n_chunk,
                     Score score) {
    const int n_seq = n_seq_side_by_side();
    llama_context * ctx = open_context(
        s, context_params(s, n_seq * CHUNK, std::min(N_BATCH, n_seq * CHUNK), n_seq, N_THREADS));
    warm_up(ctx, s);
    const bool add_bos = llama_vocab_get_add_bos(s.vocab);
    const int first = CHUNK / 2;
    const int n_scored = CHUNK - 1 - first;
    llama_batch batch = llama_batch_init(std::min(N_BATCH, CHUNK * n_seq), 0, 1);
    for (int c = 0; c < n_chunk; c += n_seq) {
        const int n_here = std::min(n_seq, n_chunk - c);
        llama_memory_clear(llama_get_memory(ctx), true);
        batch.n_tokens = 0;
        for (int seq = 0; seq < n_here; ++seq) {
            const int start = (c + seq) * CHUNK;
            for (int k = 0; k < CHUNK; ++k) {
                const int j = batch.n_tokens++;
                batch.token[j]     = k == 0 && add_bos ? llama_vocab_bos(s.vocab) : tokens[start + k];
                batch.pos[j]       = k;
                batch.n_seq_id[j]  = 1;
                batch.seq_id[j][0] = seq;
                batch.logits[j]    = k >= first;
            }
        }
        if (llama_decode(ctx, batch) != 0) {
            die("llama_decode failed");
        }
        for (int seq = 0; seq < n_here; ++seq) {
            const int start = (c + seq) * CHUNK;
            for (int k = 0; k < n_scored; ++k) {
                const float * row = llama_get_logits_ith(ctx, seq * CHUNK + first + k);
                score(row, tokens[start + first + k + 1]);
            }
        }
    }
    llama_batch_free(batch);
    llama_free(ctx);
}

int run_base(const Setup & s, const char * out_path) {
    const int n_chunk = std::min(N_CHUNKS, (int) s.tokens.size() / CHUNK);
    if ((int) s.tokens.size() < 2 * CHUNK) {
        die("the text is too short for two chunks");
    }
    FILE * f = fopen(out_path, "wb");
    if (f == nullptr) {
        die("cannot write the base file");
    }
    const int32_t header[3] = {CHUNK, s.n_vocab, n_chunk};
    fwrite(BASE_MAGIC, 1, sizeof BASE_MAGIC, f);
    fwrite(header, sizeof(int32_t), 3, f);
    fwrite(s.tokens.data(), sizeof(llama_token), (size_t) n_chunk * CHUNK, f);
    double nll = 0.0;
    Digest digest;
    BaseRow row;
    long count = 0;
    for_each_scored(s, s.tokens, n_chunk, [&](const float * logits, llama_token next) {
        const float log_norm = quantize_row(logits, s.n_vocab, row);
        nll += (double) (log_norm - logits[next]);
        ++count;
        digest.add(logits, s.n_vocab);
        fwrite(&row.scale, sizeof(float), 1, f);
        fwrite(&row.floor, sizeof(float), 1, f);
        if (fwrite(row.steps.data(), sizeof(uint16_t), row.steps.size(), f) != row.steps.size()) {
            die("cannot write the base file");
        }
    });
    if (fclose(f) != 0) {
        die("cannot write the base file");
    }
    printf("ppl=%.4f\n", exp(nll / count));
    printf("tokens=%ld\nchunks=%d\nvocab=%d\ndigest=%016llx\n", count, n_chunk, s.n_vocab,
           (unsigned long long) digest.h);
    return 0;
}

int run_kld(Setup & s, const char * base_path) {
    FILE * f = fopen(base_path, "rb");
    char magic[sizeof BASE_MAGIC];
    int32_t header[3];
    if (f == nullptr || fread(magic, 1, sizeof magic, f) != sizeof magic ||
        memcmp(magic, BASE_MAGIC, sizeof magic) != 0 || fread(header, sizeof(int32_t), 3, f) != 3) {
        die("not a base file of this harness");
    }
    if (header[0] != CHUNK || header[1] != s.n_vocab) {
        die("the base file was made with another chunk size or vocabulary");
    }
    const int n_chunk = header[2];
    std::vector<llama_token> tokens((size_t) n_chunk * CHUNK);
    if (fread(tokens.data(), sizeof(llama_token), tokens.size(), f) != tokens.size()) {
        die("the base file is truncated");
    }
    Totals t;
    Digest digest;
    BaseRow row;
    row.steps.resize(s.n_vocab);
    for_each_scored(s, tokens, n_chunk, [&](const float * logits, llama_token next) {
        if (fread(&row.scale, sizeof(float), 1, f) != 1 || fread(&row.floor, sizeof(float), 1, f) != 1 ||
            fread(row.steps.data(), sizeof(uint16_t), row.steps.size(), f) != row.steps.size()) {
            die("the base file is truncated");
        }
        compare_row(logits, s.n_vocab, row, next, t);
        digest.add(logits, s.n_vocab);
    });
    fclose(f);
    const double mean = t.kld / t.count;
    const double spread = t.count > 10 ? sqrt(fmax(t.kld2 / t.count - mean * mean, 0.0) / (t.count - 1)) : 0.0;
    printf("ppl=%.6f\nppl_base=%.6f\n", exp(t.nll / t.count), exp(t.nll_base / t.count));
    printf("kld=%.6f\nkld_uncertainty=%.6f\n", mean, spread);
    printf("top1=%.3f\n", 100.0 * (1.0 * t.same_top / t.count));
    printf("tokens=%ld\nchunks=%d\nvocab=%d\ndigest=%016llx\n", t.count, n_chunk, s.n_vocab,
           (unsigned long long) digest.h);
    return 0;
}

// -- the shift and state checks --------------------------------------------------------------

// mean KL(P_ref || P_test) per token, top-1 agreement, largest absolute logit difference
void compare(const char * name, const std::vector<float> & ref, const std::vector<float> & test,
             int n_tokens, int n_vocab) {
    double kld_sum = 0.0;
    int same_top = 0;
    double max_diff = 0.0;
    for (int t = 0; t < n_tokens; ++t) {
        const float * a = ref.data()  + (size_t) t * n_vocab;
        const float * b = test.data() + (size_t) t * n_vocab;
        double ma = a[0], mb = b[0];
        int ia = 0, ib = 0;
        for (int v = 1; v < n_vocab; ++v) {
            if (a[v] > ma) { ma = a[v]; ia = v; }
            if (b[v] > mb) { mb = b[v]; ib = v; }
        }
        double za = 0.0, zb = 0.0;
        for (int v = 0; v < n_vocab; ++v) {
            za += exp(a[v] - ma);
            zb += exp(b[v] - mb);
            max_diff = fmax(max_diff, fabs((double) a[v] - b[v]));
        }
        double kld = 0.0;
        for (int v = 0; v < n_vocab; ++v) {
            const double la = a[v] - ma - log(za);
            const double lb = b[v] - mb - log(zb);
            kld += exp(la) * (la - lb);
        }
        kld_sum += kld;
        same_top += ia == ib;
    }
    printf("%s.kld=%.6f\n", name, kld_sum / n_tokens);
    printf("%s.top1=%.2f\n", name, 100.0 * same_top / n_tokens);
    printf("%s.max_abs_diff=%.6f\n", name, max_diff);
}

// Fill the cache with tokens at positions N_DROP.. (nothing before them), shift them back
// by N_DROP (a K-shift: RoPE by the position delta, through build_rope_shift), then evaluate;
// compare with a cache that computed the same tokens fresh at the shifted positions. Attention
// depends on relative positions only, so both caches hold the same K/V up to rounding and
// requantization: a shift that mishandles rotated K shows up as a large divergence.
int run_shift(const Setup & s) {
    llama_context * shifted = new_context(s, false);
    decode(shifted, s.tokens, N_DROP, N_FILL, N_DROP, false);
    llama_memory_t mem = llama_get_memory(shifted);
    llama_memory_seq_add(mem, 0, N_DROP, N_FILL, -N_DROP);
    decode(shifted, s.tokens, N_FILL, N_FILL + N_EVAL, N_FILL - N_DROP, true);
    const std::vector<float> test = logits_of(shifted, N_EVAL, s.n_vocab);
    llama_free(shifted);

    llama_context * fresh = new_context(s, false);
    decode(fresh, s.tokens, N_DROP, N_FILL, 0, false);
    decode(fresh, s.tokens, N_FILL, N_FILL + N_EVAL, N_FILL - N_DROP, true);
    const std::vector<float> ref = logits_of(fresh, N_EVAL, s.n_vocab);
    llama_free(fresh);

    compare("shift", ref, test, N_EVAL, s.n_vocab);
    return 0;
}

// Evaluate N_FILL tokens in a context whose rotation is `saved_disabled`, save the session,
// load it into a context whose rotation is `loaded_disabled`, evaluate N_EVAL more tokens and
// compare with the same evaluation in a context that computed everything itself.
void state_case(const Setup & s, const char * name, bool saved_disabled, bool loaded_disabled) {
    const std::string path = std::string("rotation_checks_") + name + ".session";

    llama_context * saver = new_context(s, saved_disabled);
    decode(saver, s.tokens, 0, N_FILL, 0, false);
    if (!llama_state_save_file(saver, path.c_str(), s.tokens.data(), N_FILL)) {
        die("llama_state_save_file failed");
    }
    llama_free(saver);

    llama_context * loader = new_context(s, loaded_disabled);
    std::vector<llama_token> read(N_FILL);
    size_t n_read = 0;
    if (!llama_state_load_file(loader, path.c_str(), read.data(), read.size(), &n_read)) {
        die("llama_state_load_file failed");
    }
    decode(loader, s.tokens, N_FILL, N_FILL + N_EVAL, N_FILL, true);
    const std::vector<float> test = logits_of(loader, N_EVAL, s.n_vocab);
    llama_free(loader);
    remove(path.c_str());

    llama_context * fresh = new_context(s, loaded_disabled);
    decode(fresh, s.tokens, 0, N_FILL, 0, false);
    decode(fresh, s.tokens, N_FILL, N_FILL + N_EVAL, N_FILL, true);
    const std::vector<float> ref = logits_of(fresh, N_EVAL, s.n_vocab);
    llama_free(fresh);

    compare(name, ref, test, N_EVAL, s.n_vocab);
}

int run_state(const Setup & s) {
    state_case(s, "state_on_on",   false, false);
    state_case(s, "state_off_on",  true,  false);
    state_case(s, "state_on_off",  false, true);
    return 0;
}

// -- speed ------------------------------------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// As llama-bench measures pp and tg: the prompt in batches into an empty cache, and
// generation one token at a time into an empty cache, each after one unmeasured round.
int run_speed(const Setup & s, int n_threads, int n_prompt, int n_gen, int reps) {
    if ((int) s.tokens.size() < std::max(n_prompt, n_gen)) {
        die("the text is too short for the speed run");
    }
    llama_context * ctx = open_context(s, context_params(s, n_prompt + n_gen, N_BATCH, 1, n_threads));
    llama_memory_t mem = llama_get_memory(ctx);
    std::vector<llama_token> prompt(s.tokens.begin(), s.tokens.begin() + n_prompt);
    auto prompt_round = [&]() {
        llama_memory_clear(mem, true);
        for (int i = 0; i < n_prompt; i += N_BATCH) {
            const int n = std::min(N_BATCH, n_prompt - i);
            if (llama_decode(ctx, llama_batch_get_one(prompt.data() + i, n)) != 0) {
                die("llama_decode failed");
            }
        }
        llama_synchronize(ctx);
    };
    auto generation_round = [&](int n) {
        llama_memory_clear(mem, true);
        for (int i = 0; i < n; ++i) {
            llama_token token = s.tokens[i];
            if (llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0) {
                die("llama_decode failed");
            }
            llama_synchronize(ctx);
        }
    };
    double pp = 0.0, tg = 0.0;
    if (n_prompt > 0) {
        prompt_round();
        for (int r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            prompt_round();
            pp += n_prompt / seconds_since(t0);
        }
        printf("pp=%d\npp.ts=%.2f\n", n_prompt, pp / reps);
    }
    if (n_gen > 0) {
        generation_round(1);
        for (int r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            generation_round(n_gen);
            tg += n_gen / seconds_since(t0);
        }
        printf("tg=%d\ntg.ts=%.2f\n", n_gen, tg / reps);
    }
    llama_free(ctx);
    return 0;
}

void log_to_stderr(ggml_log_level level, const char * text, void *) {
    if (level != GGML_LOG_LEVEL_DEBUG) {
        fputs(text, stderr);
    }
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 6) {
        die("usage: rotation_checks base|kld|shift|state|speed MODEL TEXT CTK CTV [ARGS]");
    }
    const std::string mode = argv[1];

    std::ifstream in(argv[3]);
    if (!in) {
        die("cannot read the text");
    }
    std::stringstream text;
    text << in.rdbuf();
    std::string prompt = text.str();
    if (!prompt.empty() && prompt.back() == '\n') {  // as the tools read a prompt file
        prompt.pop_back();
    }

    llama_backend_init();
    llama_log_set(log_to_stderr, nullptr);

    Setup s;
    s.model = llama_model_load_from_file(argv[2], llama_model_default_params());
    if (s.model == nullptr) {
        die("cannot load the model");
    }
    s.vocab   = llama_model_get_vocab(s.model);
    s.n_vocab = llama_vocab_n_tokens(s.vocab);
    s.type_k  = parse_type(argv[4]);
    s.type_v  = parse_type(argv[5]);
    s.tokens.resize(prompt.size() + 16);
    const int n = llama_tokenize(s.vocab, prompt.c_str(), (int) prompt.size(), s.tokens.data(),
                                 (int) s.tokens.size(), true, false);
    if (n < N_FILL + N_EVAL) {
        die("the text is too short");
    }
    s.tokens.resize(n);

    int rc = 0;
    if (mode == "base" && argc == 7) {
        rc = run_base(s, argv[6]);
    } else if (mode == "kld" && argc == 7) {
        rc = run_kld(s, argv[6]);
    } else if (mode == "shift") {
        rc = run_shift(s);
    } else if (mode == "state") {
        rc = run_state(s);
    } else if (mode == "speed" && argc == 10) {
        rc = run_speed(s, atoi(argv[6]), atoi(argv[7]), atoi(argv[8]), atoi(argv[9]));
    } else {
        die("unknown mode or wrong arguments");
    }
    fflush(stdout);
    llama_model_free(s.model);
    llama_backend_free();
    return rc;
}
