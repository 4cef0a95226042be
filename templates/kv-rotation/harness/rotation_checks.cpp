// portkit's validation harness: checks of the KV-cache attention rotation through the public
// llama.h API of the tree under test. Built by portkit against the tree's libllama.
//
//   rotation_checks logits MODEL TEXT CTK CTV OUT   raw float32 logits of the first tokens
//   rotation_checks shift  MODEL TEXT CTK CTV       shifted cache vs a cache filled fresh
//   rotation_checks state  MODEL TEXT CTK CTV       session saved with rotation off/on, loaded with on/off
//
// CTK/CTV: f16, q8_0 or q4_0. Results are printed as `key=value` lines for portkit to parse.
// The env var LLAMA_ATTN_ROT_DISABLE is read by the cache constructor, so the state check
// sets it around context creation to save with one setting and load with the other.

#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int N_LOGITS = 128;  // tokens whose logits `logits` dumps
constexpr int N_FILL   = 320;  // tokens in the cache before the shift
constexpr int N_DROP   = 128;  // tokens the shift drops from the front
constexpr int N_EVAL   = 32;   // tokens evaluated after the shift / after loading a state

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

llama_context * new_context(const Setup & s, bool rotation_disabled) {
    if (rotation_disabled) {
        setenv("LLAMA_ATTN_ROT_DISABLE", "1", 1);
    } else {
        unsetenv("LLAMA_ATTN_ROT_DISABLE");
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = 1024;
    cp.n_batch         = 512;
    cp.n_ubatch        = 512;
    cp.n_threads       = 2;
    cp.n_threads_batch = 2;
    cp.type_k          = s.type_k;
    cp.type_v          = s.type_v;
#ifdef PORTKIT_FLASH_ATTN_BOOL
    cp.flash_attn = true;
#else
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
#endif
    llama_context * ctx = llama_init_from_model(s.model, cp);
    if (ctx == nullptr) {
        die("cannot create a context");
    }
    return ctx;
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

int run_logits(const Setup & s, const char * out_path) {
    llama_context * ctx = new_context(s, getenv("LLAMA_ATTN_ROT_DISABLE") != nullptr &&
                                            atoi(getenv("LLAMA_ATTN_ROT_DISABLE")) != 0);
    decode(ctx, s.tokens, 0, N_LOGITS, 0, true);
    const std::vector<float> logits = logits_of(ctx, N_LOGITS, s.n_vocab);
    FILE * f = fopen(out_path, "wb");
    if (f == nullptr || fwrite(logits.data(), sizeof(float), logits.size(), f) != logits.size()) {
        die("cannot write the logits file");
    }
    fclose(f);
    printf("logits.tokens=%d\nlogits.vocab=%d\n", N_LOGITS, s.n_vocab);
    llama_free(ctx);
    return 0;
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

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 6) {
        die("usage: rotation_checks logits|shift|state MODEL TEXT CTK CTV [OUT]");
    }
    const std::string mode = argv[1];

    std::ifstream in(argv[3]);
    std::stringstream text;
    text << in.rdbuf();
    const std::string prompt = text.str();

    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);

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
    if (mode == "logits" && argc >= 7) {
        rc = run_logits(s, argv[6]);
    } else if (mode == "shift") {
        rc = run_shift(s);
    } else if (mode == "state") {
        rc = run_state(s);
    } else {
        die("unknown mode or missing OUT");
    }
    llama_model_free(s.model);
    llama_backend_free();
    return rc;
}
