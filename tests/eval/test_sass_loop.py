"""`sass_loop.straight_opcodes`: the opcodes of a loop-free kernel's path, entry to first EXIT, from
SASS text as cuobjdump prints it (a subroutine after EXIT, e.g. a division's slow path, not counted)."""
from agentq.eval.sass_loop import straight_opcodes

SASS = """
        Function : _k
.text._k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   MUFU.RCP R3, R2 ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
        /*0030*/                   FFMA R4, R3, R2, -1 ;
        /*0040*/                   FFMA R4, R3, R2, -1 ;
        /*0050*/                   EXIT ;
.L_x_1:
        /*0060*/                   FFMA R5, R5, R5, R5 ;
        /*0070*/                   RET.REL.NODEC R20 `(_k) ;
"""


def test_straight_opcodes_counts_the_path_to_the_first_exit():
    # cuobjdump separates address and instruction with tabs; the labels carry none
    sass = "\n".join(line.replace("*/ ", "*/\t", 1) if "/*" in line else line for line in SASS.splitlines())
    ops = straight_opcodes(sass)
    assert ops == {"MOV": 1, "MUFU.RCP": 1, "BRA": 1, "FFMA": 2, "EXIT": 1}
