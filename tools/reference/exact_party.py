"""The exact-third-party verdict of fullsize_compare.py, kept free of torch so it can be tested
anywhere: given the comparison's result (stages_vs_atlas_f32 and
route_set_agreement_vs_atlas_f32, each with entries atlas_bf16 / hf_bf16_b1 / hf_bf16_b8), is
atlas bf16 at least as close to exact math (atlas's f32 mode) as transformers bf16 is?
"""


def verdict_vs_exact(res):
    st, rt = res["stages_vs_atlas_f32"], res["route_set_agreement_vs_atlas_f32"]
    stages = sorted(st["atlas_bf16"], key=lambda s: int(s.split(".")[1]))
    closer = [s for s in stages if st["atlas_bf16"][s]["max"] <= st["hf_bf16_b1"][s]["max"]]
    layers = sorted(rt["atlas_bf16"], key=int)

    def mean(d):
        return sum(d[l] for l in layers) / len(layers)

    final = stages[-1]
    out = {
        "stages": len(stages),
        "stages_atlas_closer_or_equal": len(closer),
        "final_stage": {"name": final, "atlas": st["atlas_bf16"][final]["max"], "hf_b1": st["hf_bf16_b1"][final]["max"]},
        "route_agreement_mean": {"atlas": mean(rt["atlas_bf16"]), "hf_b1": mean(rt["hf_bf16_b1"])},
        "route_agreement_min": {"atlas": min(rt["atlas_bf16"].values()), "hf_b1": min(rt["hf_bf16_b1"].values())},
    }
    out["atlas_at_least_as_exact"] = (len(closer) == len(stages) and
                                      out["route_agreement_mean"]["atlas"] >= out["route_agreement_mean"]["hf_b1"])
    return out
