/*
 * arch.c — the table of architectures (see arch.h). Adding a family is a row here, plus the blocks it
 * needs in attention.c / moe.c when it needs one strata does not have.
 *
 * The rows' fixed choices are facts of each family's reference implementation and of llama.cpp's GGUF
 * conversion: qwen2moe and olmoe keep Hugging Face's rotary layout (pairs i, i + n_rot/2); the llama
 * family (mixtral) and granitemoe have their q and k rows permuted by the converter into adjacent pairs;
 * qwen2moe and olmoe use the raw top-k softmax weights, mixtral and granitemoe renormalize them.
 */
#include "arch.h"

#include <stdio.h>
#include <string.h>

#include "model.h"

static const arch_desc ARCHS[] = {
    /* arch, family, attn, qk_norm, rope, gating, norm_topk, shexp, multipliers, qk_norm_optional, ffn_norm,
     * missing, swa_period, yarn_untruncated, ffn_act */
    {"qwen3moe", "Qwen3-MoE", ATTN_GQA, QK_NORM_HEAD, ROPE_NEOX, GATING_SOFTMAX, 1, SHEXP_NONE, 0, 0, NULL, NULL, 0, 0,
     FFN_ACT_SILU},
    {"qwen2moe", "Qwen2-MoE", ATTN_GQA, QK_NORM_NONE, ROPE_NEOX, GATING_SOFTMAX, 0, SHEXP_SIGMOID_GATE, 0, 0, NULL,
     NULL, 0, 0, FFN_ACT_SILU},
    {"llama", "Mixtral", ATTN_GQA, QK_NORM_NONE, ROPE_NORM, GATING_SOFTMAX, 1, SHEXP_NONE, 0, 0, NULL, NULL, 0, 0,
     FFN_ACT_SILU},
    {"olmoe", "OLMoE", ATTN_GQA, QK_NORM_FULL, ROPE_NEOX, GATING_SOFTMAX, 0, SHEXP_NONE, 0, 0, NULL, NULL, 0, 0,
     FFN_ACT_SILU},
    {"granitemoe", "Granite-MoE", ATTN_GQA, QK_NORM_NONE, ROPE_NORM, GATING_SOFTMAX, 1, SHEXP_NONE, 1, 0, NULL, NULL, 0,
     0, FFN_ACT_SILU},
    /* sigmoid routing with the correction bias, partial rotary, dense leading layers, q/k/v biases,
     * shared experts added as they are; per-head q/k norms in files that have them (use_qk_norm) */
    {"glm4moe", "GLM-4.5 MoE", ATTN_GQA, QK_NORM_NONE, ROPE_NEOX, GATING_SIGMOID, 1, SHEXP_PLAIN, 0, 1,
     "post_attention_norm", NULL, 0, 0, FFN_ACT_SILU},
    /* attention sinks, sliding-window attention on the even layers, biases on q/k/v/o, the router and the
     * experts, YaRN with an untruncated ramp, the top-k logits' softmax (the softmax of all, renormalized over
     * the top k: the same weights), the clamped SwiGLU */
    {"gpt-oss", "gpt-oss", ATTN_GQA, QK_NORM_NONE, ROPE_NEOX, GATING_SOFTMAX, 1, SHEXP_NONE, 0, 0,
     "post_attention_norm", NULL, 2, 1, FFN_ACT_SWIGLU_OAI},
    /* multi-head latent attention with its compressed cache; softmax (V2) or sigmoid routing with the
     * correction bias and group-limited top-k (V3), routed scale, shared experts, dense leading layers */
    {"deepseek2", "DeepSeek-V2/V3", ATTN_MLA, QK_NORM_NONE, ROPE_NORM, GATING_SOFTMAX, 0, SHEXP_PLAIN, 0, 0, NULL, NULL,
     0, 0, FFN_ACT_SILU},
    /* known families whose blocks are not all here yet: opening one says which block is missing */
    {"granitemoeshared", "Granite-MoE (shared)", ATTN_GQA, QK_NORM_NONE, ROPE_NORM, GATING_SOFTMAX, 1, SHEXP_PLAIN, 1,
     0, NULL, "granite's shared experts are not supported yet", 0, 0, FFN_ACT_SILU},
    {"qwen3next", "Qwen3-Next", ATTN_GQA, QK_NORM_HEAD, ROPE_NEOX, GATING_SOFTMAX, 1, SHEXP_SIGMOID_GATE, 0, 0, NULL,
     "the gated delta-net (linear attention) layers are not supported yet", 0, 0, FFN_ACT_SILU},
};

const arch_desc *arch_find(const char *arch) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (strcmp(ARCHS[i].arch, arch) == 0) return &ARCHS[i];
    return NULL;
}

const char *arch_supported_list(void) {
    return "qwen3moe, qwen2moe, llama with experts (Mixtral), olmoe, granitemoe, glm4moe, gpt-oss, deepseek2";
}

/* The attention options past the first ones (output bias, sinks, sliding windows), appended to buf; the count
 * of chars written (as snprintf returns, clamped to what fits). */
static int attn_extras(const hparams *hp, char *buf, size_t len) {
    char swa[64] = "";
    if (hp->n_swa > 0)
        snprintf(swa, sizeof swa, ", sliding window %d on %d of every %d layers", hp->n_swa, hp->ad->swa_period - 1,
                 hp->ad->swa_period);
    int n = snprintf(buf, len, "%s%s%s", hp->out_bias ? ", output bias" : "", hp->attn_sinks ? ", sinks" : "", swa);
    return n < 0 ? 0 : (size_t)n >= len ? (int)len : n;
}

void arch_describe(const hparams *hp, char *buf, size_t len) {
    const arch_desc *a = hp->ad;
    if (!a || !len) return;
    const char *qk = hp->qk_norm == QK_NORM_HEAD   ? ", q/k norm per head"
                     : hp->qk_norm == QK_NORM_FULL ? ", q/k norm over the projection"
                                                  : "";
    char rope[96];
    int n = snprintf(rope, sizeof rope, "rope %s", a->rope == ROPE_NORM ? "norm" : "neox");
    if (hp->n_rot != hp->head_dim && n > 0 && (size_t)n < sizeof rope)
        n += snprintf(rope + n, sizeof rope - (size_t)n, " %d/%d dims", hp->n_rot, hp->head_dim);
    if (hp->rope_scaling != ROPE_SCALING_NONE && n > 0 && (size_t)n < sizeof rope)
        snprintf(rope + n, sizeof rope - (size_t)n, " %s x%g", hp->rope_scaling == ROPE_SCALING_YARN ? "yarn" : "linear",
                 (double)hp->rope_factor);
    const char *shexp = a->shexp == SHEXP_SIGMOID_GATE ? ", shared expert with sigmoid gate"
                        : a->shexp == SHEXP_PLAIN      ? ", shared expert"
                                                       : "";
    char dense[48] = "";
    if (hp->n_dense_lead > 0) snprintf(dense, sizeof dense, ", %d dense leading layer(s)", hp->n_dense_lead);
    char att[128];
    if (hp->attn == ATTN_MLA) {
        char q[40] = "q direct";
        if (hp->q_lora_rank > 0) snprintf(q, sizeof q, "q lora %d", hp->q_lora_rank);
        snprintf(att, sizeof att, "MLA %d heads (%s, kv lora %d, k %d, v %d; cache: latent + k_pe)", hp->n_head, q,
                 hp->kv_lora_rank, hp->head_dim, hp->head_dim_v);
    } else {
        snprintf(att, sizeof att, "GQA %d/%d", hp->n_head, hp->n_head_kv);
    }
    char groups[48] = "";
    if (hp->n_group > 1) snprintf(groups, sizeof groups, " in %d of %d groups", hp->n_group_used, hp->n_group);
    int m = snprintf(buf, len, "%s: attention %s%s%s, %s%s", a->family, att, hp->attn_bias ? ", q/k/v biases" : "", qk,
                     rope, a->multipliers ? ", granite multipliers" : "");
    if (m < 0 || (size_t)m >= len) return;
    m += attn_extras(hp, buf + m, len - (size_t)m);
    if ((size_t)m >= len) return;
    snprintf(buf + m, len - (size_t)m, "; moe %s%s%s top-%d of %d%s%s%s%s%s%s%s",
             hp->gating == GATING_SIGMOID ? "sigmoid" : "softmax", hp->expert_bias ? " with expert bias" : "",
             hp->router_bias ? " with router bias" : "", hp->n_expert_used, hp->n_expert, groups,
             hp->norm_topk ? " normalized" : "", hp->routed_scale != 1.0f ? " scaled" : "",
             hp->exp_ffn_bias ? ", expert biases" : "", hp->ffn_act == FFN_ACT_SWIGLU_OAI ? ", clamped swiglu" : "",
             shexp, dense);
}
