/* SwiGLU activation of the MLPs and experts: y = SiLU(gate) * up, SiLU(x) = x * sigmoid(x).
 * y may alias gate or up. */
#include <math.h>

#include "kernels/kernels.h"

void kcpu_swiglu(float *y, const float *gate, const float *up, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		float g = gate[i];
		y[i] = g / (1.0f + expf(-g)) * up[i];
	}
}
