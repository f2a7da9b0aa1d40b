// Helpers shared by Loom's tests.
#pragma once
