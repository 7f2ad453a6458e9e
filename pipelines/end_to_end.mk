# The paper's end-to-end experiments (reservoir train) as file targets; included by Makefile.
#
#   make -C pipelines table3 LIMIT=1000 STEPS=2000       # random transformer against random LSTMs
#   make -C pipelines table1 PRETRAINED=gpt2 DATA_DIR=/path/to/data
#   make -C pipelines table15 DATA_TASKS=               # only the tasks that need no download
#   make -C pipelines table3 LIMIT=8 STEPS=1 DATA_TASKS= OUT_ROOT=/tmp/pipetest TRAIN_OPTS="--batch-size 4"  # smoke test
#
# Every run trains the chosen parameter groups (`reservoir train --trainable`) on one task and
# backbone and leaves a marker out/LIMIT/train/TAG/TASK/BACKBONE/GROUPS[~bN][~tT].done holding
# the run's summary, whose last line is its result file (under out/LIMIT/results/TASK/BACKBONE/).
# GROUPS joins the trained groups with "+" (input+pos+ln+out), ~bN runs N blocks, ~tT reports the
# steps to validation accuracy T; TAG names the training settings (STEPS, SEEDS, LR, TRAIN_OPTS),
# so changing one trains again instead of reusing the old marker. A table renders exactly the
# results its markers name (the result folders also hold other tables' and output-only results).
#
# Tasks: TASKS_N defaults to the paper's tasks for table N among those this machine can run:
# bit_memory, bit_xor and listops are generated; DATA_TASKS (mnist, cifar10 by default) read
# DATA_DIR (`reservoir data fetch TASK`); add cifar10_lra remote_homology to DATA_TASKS for the
# paper's full set, or set DATA_TASKS= to skip every download. Which tasks, rows and groups each
# table has follows the paper (reservoir/report/paper.py holds every result table, checked cell by cell).
#
# Backbones: PRETRAINED stands in for language-pretrained GPT-2 (Makefile); its -random and
# -stats twins for the random and statistics-only GPT-2. With GPT-2's weights at hand set
# PRETRAINED=gpt2 SIZES="gpt2 gpt2-medium gpt2-large gpt2-random gpt2-medium-random gpt2-large-random".

comma := ,
STEPS ?= 2000
SEEDS ?= 1
LR ?= 1e-3
LSTM_LR ?= $(LR)
TRAIN_OPTS ?=
REPORT_OPTS ?=
# rows of the paper's tables our settings stand for (`reservoir report --as`)
FPT_GROUPS := input,pos,ln,out
PAPER_AS_1 ?= --as $(PRETRAINED):$(FPT_GROUPS)=FPT --as $(FULL):input,pos,ln,attn,ff,out=Full \
	--as $(FULL_LSTM):input,lstm,out=LSTM
PAPER_AS_6 ?= --as $(PRETRAINED)=FPT --as $(PRETRAINED)-random=Random
PAPER_AS_9 ?= --as $(PRETRAINED)=Pretrained --as $(PRETRAINED)-stats='Statistics Only' --as $(PRETRAINED)-random=Default
PAPER_AS_11 ?= --as $(PRETRAINED)=Pretrained --as $(PRETRAINED)-random=Random
PAPER_AS_13 ?= --as $(PRETRAINED):$(FPT_GROUPS)=FPT --as $(PRETRAINED):input,pos,ln,ff,out='+ Feedforward' \
	--as $(PRETRAINED):input,pos,ln,attn,out='+ Attention' --as $(PRETRAINED):input,pos,ln,attn,ff,out='+ Both'
PAPER_AS_15 ?= --as $(PRETRAINED):out='output only' --as $(PRETRAINED):ln,out='+ layernorm' --as $(PRETRAINED):input,ln,out='+ input' \
	--as $(PRETRAINED):$(FPT_GROUPS)='+ positions'
# table 16's columns are frozen / finetuned layer norms, not tasks: the report cannot lay our rows beside them yet
PAPER_AS_16 ?=
PAPER_AS_17 ?= --as $(PRETRAINED)='GPT-2 (FPT Default)'
PAPER_AS_21 ?= --as $(PRETRAINED)-random:out='output only' --as $(PRETRAINED)-random:ln,out='+ layernorm' \
	--as $(PRETRAINED)-random:input,ln,out='+ input' --as $(PRETRAINED)-random:$(FPT_GROUPS)='+ positions'
DATA_TASKS ?= mnist cifar10

PAPER_TASKS := bit_memory bit_xor listops mnist cifar10 cifar10_lra remote_homology
GENERATED_TASKS := bit_memory bit_xor listops
# $(call runnable,TASKS): the given paper tasks this machine runs (generated ones and DATA_TASKS); a
# Llama-family PRETRAINED trains on all of them (all-zero input tokens included: README, "Experiments")
runnable = $(filter $(GENERATED_TASKS) $(DATA_TASKS),$(1))

# trained groups
FPT := input+pos+ln+out
ALL_GROUPS := input+pos+ln+attn+ff+out
# table 1: the fully trained transformer (random init, every group) and LSTM (its own group)
FULL ?= $(PRETRAINED)-random
FULL_LSTM ?= lstm
# tables 3 to 5: the random LSTMs beside the random transformer
LSTMS_3 ?= lstm
LSTMS_4 ?= lstm lstm-12 lstm-12-residual
LSTMS_5 ?= lstm lstm-pos lstm-12-residual lstm-12-residual-pos
# table 6: validation accuracy whose first crossing counts as converged (TARGET_6_TASK overrides)
TARGET_6 ?= 0.9
TARGET_6_listops ?= 0.3
target_6 = $(or $(TARGET_6_$(1)),$(TARGET_6))
# table 8: the model sizes (GPT-2 small/medium/large and their random twins with weights at hand)
SIZES ?= $(PRETRAINED) gpt2-random gpt2-medium-random gpt2-large-random
# table 11: numbers of blocks, and the groups trained at each
DEPTHS_11 ?= 1 2 3 6 12
GROUPS_11 ?= $(FPT)
# table 13: the FPT, + feedforward, + attention, + both
MORE ?= $(FPT) input+pos+ln+ff+out input+pos+ln+attn+out $(ALL_GROUPS)
# tables 15/19 and 21: groups added one after another; 18 and 20: each group on its own
SUCCESSIVE ?= out ln+out input+ln+out $(FPT)
SINGLE ?= out ln+out input+out pos+out
# table 16: layer norms frozen against trained
LN_16 ?= input+pos+out $(FPT)
# table 17: other language-pretrained architectures in the paper's place (GPT-2, BERT-style and others);
# registered names only, since Make cannot have ':' or '/' in a file target (with GPT-2's weights,
# OTHER_ARCHS="gpt2 ..."). Loadable here: SmolLM2 (a Llama) and GPT-2's random twin.
OTHER_ARCHS ?= $(PRETRAINED) gpt2-random

TASKS_1 ?= $(call runnable,$(PAPER_TASKS))
TASKS_3 ?= $(call runnable,$(PAPER_TASKS))
TASKS_4 ?= $(TASKS_3)
TASKS_5 ?= $(TASKS_3)
TASKS_6 ?= $(call runnable,$(PAPER_TASKS))
TASKS_8 ?= $(call runnable,cifar10)
TASKS_9 ?= $(call runnable,$(PAPER_TASKS))
TASKS_11 ?= listops
TASKS_13 ?= $(call runnable,$(PAPER_TASKS))
TASKS_15 ?= $(call runnable,$(PAPER_TASKS))
TASKS_16 ?= $(call runnable,cifar10)
TASKS_17 ?= $(call runnable,listops cifar10)
TASKS_18 ?= $(TASKS_15)
TASKS_19 ?= $(TASKS_15)
TASKS_20 ?= $(TASKS_15)
TASKS_21 ?= $(TASKS_15)

# out/LIMIT/train/TAG: the training settings every marker below depends on
TRAIN_TAG := steps$(STEPS)_seeds$(SEEDS)_lr$(subst $(comma),-,$(LR))$(if $(filter-out $(LR),$(LSTM_LR)),_lstmlr$(subst $(comma),-,$(LSTM_LR)))$(if $(strip $(TRAIN_OPTS)),_opts$(shell printf '%s' '$(TRAIN_OPTS)' | md5sum | cut -c1-8))
TRAIN := $(OUT)/train/$(TRAIN_TAG)

# $(call runs,TASKS,BACKBONES,GROUPS): the markers of every combination
runs = $(foreach t,$(1),$(foreach b,$(2),$(foreach g,$(3),$(TRAIN)/$(t)/$(b)/$(g).done)))

.PHONY: table1 table3 table4 table5 table6 table8 table9 table11 table13 table15 table16 table17 table18 \
	table19 table20 table21

# out/LIMIT/train/TAG/TASK/BACKBONE/GROUPS[~bN][~tT].done: one `reservoir train` run (its summary; last line: the result)
run_word = $(word $(1),$(subst /, ,$*))
run_spec = $(subst ~, ,$(call run_word,3))
run_opts = $(patsubst b%,--blocks %,$(filter b%,$(wordlist 2,9,$(run_spec)))) \
	$(patsubst t%,--target %,$(filter t%,$(wordlist 2,9,$(run_spec))))
run_lr = $(if $(filter lstm%,$(call run_word,2)),$(LSTM_LR),$(LR))
$(TRAIN)/%.done: | $(NEEDS)
	@mkdir -p $(@D)
	$(RESERVOIR) -q train --task $(call run_word,1) --backbone $(call run_word,2) \
		--trainable $(subst +,$(comma),$(firstword $(run_spec))) $(strip $(run_opts)) --lr $(run_lr) \
		--steps $(STEPS) --seeds $(SEEDS) --limit $(LIMIT) --data-dir $(DATA_DIR) $(TRAIN_OPTS) > $@.tmp || { rm -f $@.tmp; exit 1; }
	@mv -f $@.tmp $@

# $(call render,N): out/LIMIT/tableN.md (and .csv, plots/tableN/), `reservoir report --paper N` of the
# results the table's markers name; PAPER_AS_N maps our settings to the paper's rows
define render
@test -n "$^" || { echo "$@: no runs to report (are its TASKS_ or backbone variables empty?)" >&2; exit 2; }
$(RESERVOIR) report $$(tail -qn1 $^) --paper $(1) $(PAPER_AS_$(1)) --csv $(OUT)/table$(1).csv \
	--plots $(OUT)/plots/table$(1) $(REPORT_OPTS) > $@.tmp || { rm -f $@.tmp; exit 1; }
@mv -f $@.tmp $@ && cat $@
endef

$(OUT)/table1.md: $(call runs,$(TASKS_1),$(PRETRAINED),$(FPT)) $(call runs,$(TASKS_1),$(FULL),$(ALL_GROUPS)) \
		$(call runs,$(TASKS_1),$(FULL_LSTM),input+lstm+out)
	$(call render,1)

$(OUT)/table3.md: $(call runs,$(TASKS_3),$(PRETRAINED)-random $(LSTMS_3),$(FPT))
	$(call render,3)

$(OUT)/table4.md: $(call runs,$(TASKS_4),$(PRETRAINED)-random $(LSTMS_4),$(FPT))
	$(call render,4)

$(OUT)/table5.md: $(call runs,$(TASKS_5),$(PRETRAINED)-random $(LSTMS_5),$(FPT))
	$(call render,5)

$(OUT)/table6.md: $(foreach t,$(TASKS_6),$(call runs,$(t),$(PRETRAINED) $(PRETRAINED)-random,$(FPT)~t$(call target_6,$(t))))
	$(call render,6)

$(OUT)/table8.md: $(call runs,$(TASKS_8),$(SIZES),$(FPT))
	$(call render,8)

$(OUT)/table9.md: $(call runs,$(TASKS_9),$(PRETRAINED) $(PRETRAINED)-stats $(PRETRAINED)-random,$(FPT))
	$(call render,9)

$(OUT)/table11.md: $(foreach n,$(DEPTHS_11),$(call runs,$(TASKS_11),$(PRETRAINED) $(PRETRAINED)-random,$(GROUPS_11)~b$(n)))
	$(call render,11)

$(OUT)/table13.md: $(call runs,$(TASKS_13),$(PRETRAINED),$(MORE))
	$(call render,13)

$(OUT)/table15.md: $(call runs,$(TASKS_15),$(PRETRAINED),$(SUCCESSIVE))
	$(call render,15)

$(OUT)/table16.md: $(call runs,$(TASKS_16),$(PRETRAINED) $(PRETRAINED)-random,$(LN_16))
	$(call render,16)

$(OUT)/table17.md: $(call runs,$(TASKS_17),$(OTHER_ARCHS),$(FPT))
	$(call render,17)

$(OUT)/table18.md: $(call runs,$(TASKS_18),$(PRETRAINED),$(SINGLE))
	$(call render,18)

$(OUT)/table19.md: $(call runs,$(TASKS_19),$(PRETRAINED),$(SUCCESSIVE))
	$(call render,19)

$(OUT)/table20.md: $(call runs,$(TASKS_20),$(PRETRAINED)-random,$(SINGLE))
	$(call render,20)

$(OUT)/table21.md: $(call runs,$(TASKS_21),$(PRETRAINED)-random,$(SUCCESSIVE))
	$(call render,21)

table1: $(OUT)/table1.md ## FPT (PRETRAINED) against a fully trained transformer (FULL) and LSTM, end to end
table3: $(OUT)/table3.md ## random transformer against random 3-layer LSTM (LSTMS_3), FPT groups trained
table4: $(OUT)/table4.md ## random LSTM with 12 layers and residual connections (LSTMS_4) beside the random transformer
table5: $(OUT)/table5.md ## random LSTMs with learned positions (LSTMS_5) beside the random transformer
table6: $(OUT)/table6.md ## steps to validation accuracy TARGET_6 (TARGET_6_TASK): PRETRAINED against its random twin
table8: $(OUT)/table8.md ## model size: the FPT on each of SIZES (CIFAR-10, DATA_DIR)
table9: $(OUT)/table9.md ## statistics-only initialisation (PRETRAINED-stats) against pretrained and random
table11: $(OUT)/table11.md ## ListOps by number of blocks (DEPTHS_11), layer norms trained, pretrained against random
table13: $(OUT)/table13.md ## finetuning more: the FPT, + feedforward, + attention, + both (MORE)
table15: $(OUT)/table15.md ## ablation, pretrained: output layer, + layer norms, + input, + positions (SUCCESSIVE)
table16: $(OUT)/table16.md ## layer norms frozen against trained, pretrained and random (CIFAR-10, DATA_DIR)
table17: $(OUT)/table17.md ## other architectures as the frozen backbone (OTHER_ARCHS), ListOps and CIFAR-10
table18: $(OUT)/table18.md ## ablation, pretrained: each group alone with the output layer (SINGLE)
table19: $(OUT)/table19.md ## ablation, pretrained, every task: groups added one after another (SUCCESSIVE)
table20: $(OUT)/table20.md ## ablation, random: each group alone with the output layer (SINGLE)
table21: $(OUT)/table21.md ## ablation, random: groups added one after another (SUCCESSIVE)
